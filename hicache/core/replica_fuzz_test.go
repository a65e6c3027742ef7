package core

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/slab/alloc"
)

// replicaSim drives N replicas of one slab group through random scheduler calls, with
// random but agreed consensus steps: every rank finishes its transfers at its own pace (and
// sometimes fails them), and every rank runs its share of the storage jobs (the pages it
// owns) against its slab group's in-memory store, at its own pace. Data
// moves only when a transfer or storage job completes, so a page freed or reused while some
// rank still had I/O in flight on it shows up as wrong bytes in L1, L2 or storage.
type replicaSim struct {
	t     testing.TB
	rng   *rand.Rand
	cfg   Config
	cores []*Core            // rank r: CP rank r mod C of slab group r / C
	C     int                // ranks per slab group
	slabs []*kvtest.MemSlabs // per slab group
	l1    [][]byte
	pb    int

	pending [][]Transfer        // per rank: transfers started, not finished
	jobs    [][]*simJob         // per rank: its storage jobs in flight
	store   []map[PageID][]byte // per slab group (its shard): page hash -> payload
	index   map[PageID]int      // page hash -> sequence page index
	locked  [][]Handle          // per lock: each rank's node
	fail    float64             // probability that a transfer or storage job fails
	seqs    [][]int32           // the workload's sequences
	pids    []uint64            // prefetch ids handed out
	counts  map[string]int      // what the run exercised
	lastErr []error             // each rank's error at the last step
	steps   int                 // steps made
	quar    bool                // the group is in quarantine (as the sim saw it)
	trace   []string            // the last calls (for failure messages)
	handles [][]Handle          // nodes handed out (each rank's), for calls with old handles
	ev      *evModel            // the tiers rebuilt from rank 0's KV events
}

type simJob struct {
	StorageJob
	progress int
	stopped  bool // the group cut it: its I/O must stop
}

func newReplicaSim(t testing.TB, seed uint64) *replicaSim {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	n := 1 + rng.IntN(4)
	groups := 1 + rng.IntN(2) // slab groups in the replica group (tensor-parallel shards)
	opts := Options{
		PageSize:       1 + rng.IntN(4),
		L1Pages:        8 + rng.IntN(40),
		Policy:         Policy(rng.IntN(3)),
		WriteThreshold: 1 + rng.IntN(3),
		MinLoadPages:   1 + rng.IntN(2),
	}
	opts.LoadQuotaPages = 1 + rng.IntN(opts.L1Pages)
	cfg := Config{Options: opts, Slabs: n, PagesPerSlab: 2 + rng.IntN(12)}
	if rng.IntN(3) > 0 {
		cfg.L3 = true
		cfg.L3Config = L3Config{
			PrefetchPolicy:     PrefetchPolicy(rng.IntN(3)),
			MinPrefetchPages:   1 + rng.IntN(2),
			PrefetchQuotaPages: 1 + rng.IntN(n*cfg.PagesPerSlab),
			NoBackup:           rng.IntN(4) == 0,
		}
	}
	s := &replicaSim{t: t, rng: rng, cfg: cfg, C: n, pb: 24, index: map[PageID]int{}, counts: map[string]int{}}
	for range groups {
		s.slabs = append(s.slabs, kvtest.NewMemSlabs(make([]int, n), cfg.PagesPerSlab, s.pb))
		s.store = append(s.store, map[PageID][]byte{})
	}
	for i := range n * groups {
		c := cfg
		c.CPRank = i % n
		core, err := New(c)
		if err != nil {
			t.Fatalf("config %+v: %v", c, err)
		}
		s.cores = append(s.cores, core)
		s.l1 = append(s.l1, make([]byte, opts.L1Pages*s.pb))
		s.pending = append(s.pending, nil)
		s.jobs = append(s.jobs, nil)
	}
	s.cfg = s.cores[0].Config()
	s.cores[0].EnableEvents(true)
	s.ev = newEvModel()
	s.fail = []float64{0, 0.02, 0.1}[rng.IntN(3)]
	s.seqs = kvtest.RandomSequences(rng, 10+rng.IntN(30), s.cfg.PageSize)
	for _, q := range s.seqs {
		for i, h := range PrefixHashes(q, s.cfg.PageSize) {
			s.index[h] = i
		}
	}
	// Storage already holds some prefixes (another instance wrote them), not always of
	// every shard.
	for _, q := range s.seqs {
		if rng.IntN(3) == 0 {
			hs := PrefixHashes(q, s.cfg.PageSize)
			hs = hs[:rng.IntN(len(hs)+1)]
			for g := range groups {
				hole := -1 // a page lost from the middle: its owner's share ends there
				if rng.IntN(3) == 0 {
					hole = rng.IntN(len(hs) + 1)
				}
				for i, h := range hs[:len(hs)-rng.IntN(2)*rng.IntN(len(hs)+1)] {
					if i == hole {
						continue
					}
					b := make([]byte, s.pb)
					kvtest.FillKV(b, h.Index(), i, g)
					s.store[g][h] = b
				}
			}
		}
	}
	return s
}

func (s *replicaSim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("config %+v, step %d: %s\nlast calls:\n%s", s.cfg, s.steps, fmt.Sprintf(format, args...), strings.Join(s.trace, "\n"))
}

func (s *replicaSim) group(rank int) int { return rank / s.C }
func (s *replicaSim) cp(rank int) int    { return rank % s.C }

func (s *replicaSim) slot(rank int, sl int32) []byte {
	return s.l1[rank][int(sl)*s.pb : int(sl+1)*s.pb]
}

func (s *replicaSim) page(g int, p alloc.Page) []byte {
	b, err := s.slabs[g].Page(p)
	if err != nil {
		s.fatalf("%v", err)
	}
	return b
}

// each calls f on every rank and checks that the ranks agree on failure.
func (s *replicaSim) each(what string, f func(i int, c *Core) error) error {
	s.t.Helper()
	var first error
	for i, c := range s.cores {
		err := f(i, c)
		if i == 0 {
			first = err
		} else if (err == nil) != (first == nil) {
			s.fatalf("%s: rank %d: %v, rank 0: %v", what, i, err, first)
		}
	}
	return first
}

func (s *replicaSim) collect() {
	for i, c := range s.cores {
		rd := c.Ready()
		s.take(i, rd)
	}
}

func (s *replicaSim) take(i int, rd Ready) {
	if s.quar && len(rd.Transfers)+len(rd.Jobs) > 0 {
		s.fatalf("rank %d starts I/O in quarantine: %+v", i, rd)
	}
	s.pending[i] = append(s.pending[i], rd.Transfers...)
	if !s.cfg.L3 && len(rd.Jobs)+len(rd.Stops) > 0 {
		s.fatalf("rank %d got storage jobs %+v stops %v without L3", i, rd.Jobs, rd.Stops)
	}
	for _, j := range rd.Jobs {
		if len(j.Hashes) == 0 || j.Kind != StorageQuery && len(j.Pages) != len(j.Hashes) {
			s.fatalf("rank %d got storage %s %d with %d hashes and %d pages", i, j.Kind, j.Seq, len(j.Hashes), len(j.Pages))
		}
		for k, p := range j.Pages {
			if p.Slab != s.cp(i) {
				s.fatalf("rank %d got storage %s %d of page %v in another rank's slab", i, j.Kind, j.Seq, p)
			}
			if idx := s.index[j.Hashes[k]]; idx%s.C != s.cp(i) {
				s.fatalf("rank %d got storage %s %d of sequence page %d, which CP rank %d owns", i, j.Kind, j.Seq, idx, idx%s.C)
			}
		}
		s.jobs[i] = append(s.jobs[i], &simJob{StorageJob: j})
	}
	for _, seq := range rd.Stops {
		for _, j := range s.jobs[i] {
			if j.Kind == StorageRead && j.Seq == seq {
				j.stopped = true
			}
		}
	}
}

// runTransfer copies a transfer's pages now (data moves at completion).
func (s *replicaSim) runTransfer(rank int, tr Transfer) error {
	if s.fail > 0 && s.rng.Float64() < s.fail {
		return fmt.Errorf("injected failure of %s %d", tr.Kind, tr.Seq)
	}
	for _, cp := range tr.Copies {
		if cp.L2.Slab != s.cp(rank) {
			s.fatalf("rank %d copies page %v of another rank's slab", rank, cp.L2)
		}
		if free, err := s.cores[rank].Allocator().IsFree(cp.L2); err != nil || free {
			s.fatalf("rank %d: %s %d copies L2 page %v, which the allocator holds free (%v)", rank, tr.Kind, tr.Seq, cp.L2, err)
		}
		if tr.Kind == Write {
			copy(s.page(s.group(rank), cp.L2), s.slot(rank, cp.L1))
		} else {
			copy(s.slot(rank, cp.L1), s.page(s.group(rank), cp.L2))
		}
	}
	return nil
}

// local lets every rank finish a random subset of its work and report it.
func (s *replicaSim) local() {
	for i, c := range s.cores {
		var done Done
		keep := s.pending[i][:0]
		for _, tr := range s.pending[i] {
			if s.rng.IntN(3) == 0 {
				keep = append(keep, tr)
				continue
			}
			done.Transfers = append(done.Transfers, TransferDone{Kind: tr.Kind, Seq: tr.Seq, Err: s.runTransfer(i, tr)})
		}
		s.pending[i] = keep
		if s.cfg.L3 {
			done.Storage, done.Progress = s.storage(i)
			c.StorageCircuit(s.rng.IntN(20*len(s.cores)) == 0)
		}
		c.Report(done)
	}
}

// storage advances the storage jobs of a rank against its slab group's store.
func (s *replicaSim) storage(rank int) ([]StorageDone, []StorageProgress) {
	var dones []StorageDone
	var progress []StorageProgress
	io := s.cores[rank]
	g := s.group(rank)
	store := s.store[g]
	keep := s.jobs[rank][:0]
	for _, j := range s.jobs[rank] {
		if s.rng.IntN(3) == 0 {
			keep = append(keep, j)
			continue
		}
		switch j.Kind {
		case StoragePut:
			var err error
			if s.rng.Float64() < s.fail {
				err = errors.New("injected storage failure")
			} else {
				for k, p := range j.Pages {
					if free, _ := io.Allocator().IsFree(p); free {
						s.fatalf("storage backup %d reads L2 page %v, which the allocator holds free", j.Seq, p)
					}
					if err := kvtest.CheckKV(s.page(g, p), j.Hashes[k].Index(), s.index[j.Hashes[k]], g); err != nil {
						s.fatalf("storage backup %d of node %d reads wrong bytes from %v: %v", j.Seq, j.Node, p, err)
					}
					store[j.Hashes[k]] = slices.Clone(s.page(g, p))
				}
			}
			dones = append(dones, StorageDone{Kind: StoragePut, Seq: j.Seq, Err: err})
		case StorageQuery:
			n := 0
			for n < len(j.Hashes) && store[j.Hashes[n]] != nil {
				n++
			}
			dones = append(dones, StorageDone{Kind: StorageQuery, Seq: j.Seq, Pages: n})
		case StorageRead:
			if !j.stopped || s.rng.IntN(2) == 0 {
				// read (at most) a few more pages; a stopped read may still land a chunk
				// that was in flight before it acknowledges the stop
				for k := 0; k < 1+s.rng.IntN(3) && j.progress < len(j.Pages); k++ {
					v := store[j.Hashes[j.progress]]
					if v == nil {
						break
					}
					p := j.Pages[j.progress]
					if free, _ := io.Allocator().IsFree(p); free {
						s.fatalf("storage read %d writes L2 page %v, which the allocator holds free", j.Seq, p)
					}
					copy(s.page(g, p), v)
					j.progress++
				}
			}
			if j.stopped || j.progress == len(j.Pages) || store[j.Hashes[j.progress]] == nil {
				dones = append(dones, StorageDone{Kind: StorageRead, Seq: j.Seq, Pages: j.progress})
				continue
			}
			progress = append(progress, StorageProgress{Seq: j.Seq, Pages: j.progress, Cut: s.rng.IntN(8) == 0})
			keep = append(keep, j)
			continue
		}
	}
	s.jobs[rank] = keep
	return dones, progress
}

// step makes one consensus step: local completions, then the agreed vector on every rank.
func (s *replicaSim) step() {
	s.t.Helper()
	s.collect()
	s.local()
	var agreed []int64
	for i, c := range s.cores {
		rd, vec := c.Ready(), c.Vector(make([]int64, VectorLen))
		s.take(i, rd)
		if agreed == nil {
			agreed = slices.Clone(vec)
			continue
		}
		for k := range agreed {
			agreed[k] = min(agreed[k], vec[k])
		}
	}
	s.steps++
	s.tracef("step %d: agreed %v", s.steps, agreed[vWriteDone:])
	wasQuar := s.quar
	errs := make([]error, len(s.cores))
	for i, c := range s.cores {
		errs[i] = c.Apply(slices.Clone(agreed))
	}
	for i, err := range errs {
		var de, de0 *DivergedError
		if (err == nil) != (errs[0] == nil) {
			s.fatalf("rank %d: %v, rank 0: %v", i, err, errs[0])
		}
		if err != nil && (!errors.As(err, &de) || !errors.As(errs[0], &de0) || de.Step != de0.Step || de.What != de0.What) {
			s.fatalf("rank %d: %v, rank 0: %v (want the same divergence)", i, err, errs[0])
		}
		if q := s.cores[i].Quarantined(); q != s.cores[0].Quarantined() {
			s.fatalf("rank %d quarantined %t, rank 0 %t", i, q, s.cores[0].Quarantined())
		}
	}
	s.lastErr = errs
	s.quar = s.cores[0].Quarantined()
	if errs[0] != nil {
		if wasQuar {
			s.fatalf("a divergence reported in quarantine: %v", errs[0])
		}
		s.counts["diverged"]++
		s.drain()
	}
	if wasQuar && !s.quar {
		s.counts["recovered"]++
		s.checkFresh("recovery")
	}
	s.check()
}

// drain is the driver's reaction to a divergence: every transfer and storage job is
// canceled and waited for.
func (s *replicaSim) drain() {
	for i := range s.pending {
		s.pending[i] = nil
	}
	for i := range s.jobs {
		s.jobs[i] = nil
	}
	s.collect()
}

// checkFresh checks that the group is indistinguishable from freshly constructed cores.
func (s *replicaSim) checkFresh(what string) {
	s.t.Helper()
	fresh, err := New(s.cores[0].Config())
	if err != nil {
		s.fatalf("%v", err)
	}
	for i, c := range s.cores {
		if c.Allocator().Digest() != fresh.Allocator().Digest() || c.StateDigest() != fresh.StateDigest() ||
			c.Queues() != (Queues{}) || c.L1Used() != 0 || c.Nodes() != 0 || c.Pending() != 0 || !c.Idle() || c.Quarantined() {
			s.fatalf("after %s rank %d is not fresh: digest %#x (fresh %#x), state %#x (fresh %#x), queues %+v, L1 %d, nodes %d",
				what, i, c.Allocator().Digest(), fresh.Allocator().Digest(), c.StateDigest(), fresh.StateDigest(), c.Queues(), c.L1Used(), c.Nodes())
		}
	}
}

// check verifies the replicas after a step: equal state, the structural invariants, the
// accounting against a recount, and the bytes of every page the tree says is valid.
func (s *replicaSim) check() {
	s.t.Helper()
	c0 := s.cores[0]
	for i, c := range s.cores {
		if err := c.CheckInvariants(); err != nil {
			s.fatalf("rank %d: %v", i, err)
		}
		if c.Stats() != c0.Stats() {
			s.fatalf("rank %d stats %+v, rank 0 %+v", i, c.Stats(), c0.Stats())
		}
		if c.treeDigest() != c0.treeDigest() && !s.quar {
			s.fatalf("rank %d tree digest %#x, rank 0 %#x", i, c.treeDigest(), c0.treeDigest())
		}
		if s.quar {
			continue
		}
		if c.StateDigest() != c0.StateDigest() {
			s.fatalf("rank %d state digest %#x, rank 0 %#x", i, c.StateDigest(), c0.StateDigest())
		}
		s.recount(i, c)
	}
	if !s.quar {
		s.checkBytes()
	}
	s.checkEvents()
}

// recount recomputes the O(1)-maintained sums and the allocator's accounting from scratch.
func (s *replicaSim) recount(rank int, c *Core) {
	var treeSum uint64
	l1Slots := map[int32]uint64{} // this rank's pool: slot -> node
	committed := 0
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		if !n.isRoot() {
			treeSum += nodeTerm(n)
			for j, sl := range n.l1 {
				if !c.Owns(n.depth + j) {
					continue // a slot of another rank's pool (CheckInvariants checks every pool)
				}
				if other, ok := l1Slots[sl]; ok {
					s.fatalf("rank %d: L1 slot %d held by nodes %d and %d", rank, sl, other, n.id)
				}
				l1Slots[sl] = n.id
			}
			committed += len(n.l2)
			if n.hits < 0 || n.lockRef < 0 || n.l3Pins < 0 || n.ownLocks < 0 {
				s.fatalf("rank %d node %d: negative count (hits %d, lockRef %d, pins %d, own locks %d)", rank, n.id, n.hits, n.lockRef, n.l3Pins, n.ownLocks)
			}
		}
		for _, ch := range n.children {
			visit(ch)
		}
	}
	visit(c.root)
	// LRU lists: every node stands behind its descendants in its list (one eviction pass
	// frees a leaf, then its parent).
	pos := map[*treeNode]int{}
	for l, list := range []*lruList{&c.lruL1, &c.lruL2} {
		k := 0
		for n := list.front(); n != nil; n = list.after(n) {
			pos[n] = k
			k++
			if want := []int8{inL1List, inL2List}[l]; n.list != want {
				s.fatalf("rank %d: node %d in list %d says %d", rank, n.id, want, n.list)
			}
		}
	}
	for n, p := range pos {
		if q, ok := pos[n.parent]; ok && n.parent.list == n.list && q < p {
			s.fatalf("rank %d: node %d stands behind its parent %d in LRU list %d", rank, n.id, n.parent.id, n.list)
		}
	}
	if treeSum != c.treeSum {
		s.fatalf("rank %d: incremental tree sum %#x, recomputed %#x", rank, c.treeSum, treeSum)
	}
	reserved, loading := 0, 0
	for _, op := range c.writes {
		for _, p := range op.parts {
			reserved += len(p.pages)
		}
	}
	for _, op := range c.loads {
		for _, n := range op.nodes {
			loading += len(n.hashes)
		}
	}
	l3 := 0
	for _, r := range c.l3.reads {
		l3 += len(r.pages)
	}
	for _, rel := range c.l3.releases {
		l3 += rel.pages
	}
	// a read's inserted head is committed, the rest stays reserved in its range
	var readPages int
	for _, r := range c.l3.reads {
		readPages += len(r.pages)
	}
	if c.l3.reserved != l3 || c.l3.reserved < 0 || c.l3.reserved > s.cfg.L3Config.PrefetchQuotaPages && s.cfg.L3 {
		s.fatalf("rank %d: %d L2 pages reserved for storage, reads and releases hold %d (quota %d)", rank, c.l3.reserved, l3, s.cfg.L3Config.PrefetchQuotaPages)
	}
	a := c.Allocator()
	if a.CommittedPages() != committed || a.ReservedPages() != reserved+l3 {
		s.fatalf("rank %d: allocator has %d committed and %d reserved pages; tree %d committed, backups %d and storage %d reserved",
			rank, a.CommittedPages(), a.ReservedPages(), committed, reserved, l3)
	}
	if c.loadingPgs != loading || loading > s.cfg.LoadQuotaPages {
		s.fatalf("rank %d: %d pages loading, loads hold %d (quota %d)", rank, c.loadingPgs, loading, s.cfg.LoadQuotaPages)
	}
	if c.L1Used() < 0 || c.L1Used() > s.cfg.L1Pages || c.L1Used() != len(l1Slots) {
		s.fatalf("rank %d: L1 used %d of %d, nodes hold %d", rank, c.L1Used(), s.cfg.L1Pages, len(l1Slots))
	}
	// I/O in flight only on pages that are held: rule 6.
	for _, tr := range s.pending[rank] {
		for _, cp := range tr.Copies {
			if free, _ := a.IsFree(cp.L2); free {
				s.fatalf("rank %d: %s %d in flight on L2 page %v, which is free", rank, tr.Kind, tr.Seq, cp.L2)
			}
			if _, ok := l1Slots[cp.L1]; !ok {
				s.fatalf("rank %d: %s %d in flight on L1 slot %d, which is free", rank, tr.Kind, tr.Seq, cp.L1)
			}
		}
	}
	for _, j := range s.jobs[rank] {
		if j.Kind == StoragePut || j.Kind == StorageRead && j.progress < len(j.Pages) {
			for _, p := range j.Pages[min(j.progress, len(j.Pages)):] {
				if free, _ := a.IsFree(p); free && j.Kind == StorageRead {
					s.fatalf("rank %d: storage read %d in flight on L2 page %v, which is free", rank, j.Seq, p)
				}
			}
			if j.Kind == StoragePut {
				for _, p := range j.Pages {
					if free, _ := a.IsFree(p); free {
						s.fatalf("rank %d: storage backup %d in flight on L2 page %v, which is free", rank, j.Seq, p)
					}
				}
			}
		}
	}
}

// checkBytes verifies every valid L1 page on its owner and every committed L2 page.
func (s *replicaSim) checkBytes() {
	s.t.Helper()
	C := s.C
	for rank, c := range s.cores {
		g := s.group(rank)
		var visit func(n *treeNode)
		visit = func(n *treeNode) {
			if !n.isRoot() {
				for j := range n.hashes {
					idx := n.depth + j
					if n.l1 != nil && n.load == nil && !n.stale && idx%C == s.cp(rank) {
						if err := kvtest.CheckKV(s.slot(rank, n.l1[j]), n.hashes[j].Index(), idx, g); err != nil {
							s.fatalf("rank %d node %d (%v) L1 slot %d: %v", rank, n.id, n.state(), n.l1[j], err)
						}
					}
					if s.cp(rank) == 0 && n.l2 != nil {
						if err := kvtest.CheckKV(s.page(g, n.l2[j]), n.hashes[j].Index(), idx, g); err != nil {
							s.fatalf("node %d (%v) L2 page %v: %v", n.id, n.state(), n.l2[j], err)
						}
					}
				}
			}
			for _, ch := range n.children {
				visit(ch)
			}
		}
		visit(c.root)
	}
}

// op makes one random replicated scheduler call (or a local event).
func (s *replicaSim) op() {
	s.t.Helper()
	q := s.seqs[s.rng.IntN(len(s.seqs))]
	if s.rng.IntN(4) == 0 {
		q = q[:s.rng.IntN(len(q)+1)] // any prefix, partial pages included
	}
	k := s.rng.IntN(100)
	s.tracef("op %d on %d tokens (%d pages)", k, len(q), len(q)/s.cfg.PageSize)
	switch {
	case k < 30:
		var fill []FillPage
		var last []Handle
		err := s.each("insert", func(i int, c *Core) error {
			res, err := c.Insert(Request{Tokens: q})
			last = append(last, res.Last)
			if i == 0 {
				fill = res.Fill
			} else if len(res.Fill) != len(fill) {
				s.fatalf("rank %d fills %d pages, rank 0 %d", i, len(res.Fill), len(fill))
			}
			for _, f := range res.Fill {
				if f.Owner == s.cp(i) {
					kvtest.FillKV(s.slot(i, f.Slot), f.Hash.Index(), f.Index, s.group(i))
				}
			}
			return err
		})
		if err != nil && !errors.Is(err, ErrL1Full) {
			s.fatalf("insert: %v", err)
		}
		s.counts["insert"]++
		if err == nil && s.rng.IntN(4) == 0 && len(s.locked) < 4 { // a request holds what it inserted
			if err := s.each("lock", func(i int, c *Core) error { return c.Lock(last[i]) }); err != nil {
				s.fatalf("lock of an inserted node: %v", err)
			}
			s.locked = append(s.locked, last)
		}
		s.handles = append(s.handles, last)
	case k < 55:
		var last []Handle
		var m0 MatchResult
		s.each("match", func(i int, c *Core) error {
			m := c.Match(Request{Tokens: q})
			if i == 0 {
				m0 = m
			} else if m.DevicePages != m0.DevicePages || m.HostPages != m0.HostPages || !ownSlotsOnly(c, m) {
				s.fatalf("rank %d match %d+%d, rank 0 %d+%d", i, m.DevicePages, m.HostPages, m0.DevicePages, m0.HostPages)
			}
			last = append(last, m.Last)
			return nil
		})
		s.handles = append(s.handles, last)
		if m0.HostPages > 0 && s.rng.IntN(2) == 0 {
			s.counts["loadback"]++
			err := s.each("load-back", func(i int, c *Core) error { _, err := c.LoadBack(last[i]); return err })
			if err != nil && !errors.Is(err, ErrL1Full) {
				s.fatalf("load-back: %v", err)
			}
		}
		if s.rng.IntN(3) == 0 && len(s.locked) < 4 {
			if err := s.each("lock", func(i int, c *Core) error { return c.Lock(last[i]) }); err != nil {
				s.fatalf("lock: %v", err)
			}
			s.locked = append(s.locked, last)
		}
	case k < 63:
		s.unlockOne()
	case k < 65:
		// calls on handles kept from earlier calls (maybe evicted, flushed, or not locked):
		// every rank answers alike, and a refused call changes nothing
		if len(s.handles) == 0 {
			break
		}
		h := s.handles[s.rng.IntN(len(s.handles))]
		which := s.rng.IntN(2)
		held := isRootHandle(h[0]) || slices.ContainsFunc(s.locked, func(l []Handle) bool { return l[0] == h[0] })
		if which == 0 && held {
			break // an unlock by another holder of the lock
		}
		s.each("old handle", func(i int, c *Core) error {
			before := c.StateDigest()
			var err error
			if which == 0 {
				if err = c.Unlock(h[i]); err == nil {
					s.fatalf("rank %d: unlock of node %#x, which nobody locked, succeeded", i, uint64(h[i]))
				}
			} else {
				_, err = c.LoadBack(h[i])
			}
			if errors.Is(err, ErrBadArgument) && c.StateDigest() != before { // ErrL1Full may have evicted
				s.fatalf("rank %d: a refused call (%v) changed the state", i, err)
			}
			if err != nil && !errors.Is(err, ErrBadArgument) && !errors.Is(err, ErrL1Full) {
				s.fatalf("rank %d: old handle: %v", i, err)
			}
			return err
		})
	case k < 72:
		n, m := s.rng.IntN(12), s.rng.IntN(12)
		s.each("evict", func(i int, c *Core) error {
			// never more than the ask; short of it only when no candidate is left
			freed, pending := c.EvictL1(n)
			if freed+pending > n {
				s.fatalf("rank %d: EvictL1(%d) took %d freed + %d pending pages", i, n, freed, pending)
			}
			if freed+pending < n && !c.Quarantined() {
				s.noCandidate(i, c, "EvictL1", l1Evictable)
			}
			if freed := c.EvictL2(m); freed < m && !c.Quarantined() {
				s.noCandidate(i, c, "EvictL2", l2Evictable)
			}
			return nil
		})
	case k < 76:
		s.cores[s.rng.IntN(len(s.cores))].HintEvict(s.rng.IntN(6), s.rng.IntN(6))
	case k < 86:
		var id uint64
		s.each("prefetch", func(i int, c *Core) error {
			r := c.Prefetch(Request{Tokens: q})
			if i == 0 {
				id = r.ID
			} else if r.ID != id {
				s.fatalf("rank %d prefetch id %d, rank 0 %d", i, r.ID, id)
			}
			return nil
		})
		if id != 0 {
			s.pids = append(s.pids, id)
			s.counts["prefetch"]++
		}
	case k < 92:
		if len(s.pids) > 0 {
			id := s.pids[s.rng.IntN(len(s.pids))]
			s.each("revoke", func(_ int, c *Core) error { c.RevokePrefetch(id); return nil })
		}
	case k < 95:
		if s.cores[0].Idle() {
			s.flush()
			break
		}
		// not idle: the flush is refused and changes nothing
		s.each("busy reset", func(i int, c *Core) error {
			before, tree := c.StateDigest(), c.treeDigest()
			err := c.Reset()
			if !errors.Is(err, ErrBusy) || c.StateDigest() != before || c.treeDigest() != tree {
				s.fatalf("rank %d: reset of a busy core: %v, state %#x -> %#x", i, err, before, c.StateDigest())
			}
			return err
		})
	case k < 96:
		if s.rng.IntN(4) == 0 && len(s.cores) > 1 { // one rank has nobody to disagree with
			r := s.rng.IntN(len(s.cores))
			if s.rng.IntN(2) == 0 {
				s.cores[r].PerturbTree()
			} else {
				s.cores[r].PerturbPlacement()
			}
		}
	}
}

// noCandidate checks that no node of c's tree is evictable after an eviction fell short.
func (s *replicaSim) noCandidate(rank int, c *Core, what string, evictable func(*treeNode) bool) {
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		if !n.isRoot() && evictable(n) {
			s.fatalf("rank %d: %s fell short, but node %d (%v) is evictable", rank, what, n.id, n.state())
		}
		for _, ch := range n.children {
			visit(ch)
		}
	}
	visit(c.root)
}

func (s *replicaSim) unlockOne() {
	if len(s.locked) == 0 {
		return
	}
	k := s.rng.IntN(len(s.locked))
	nd := s.locked[k]
	s.locked = slices.Delete(s.locked, k, k+1)
	if err := s.each("unlock", func(i int, c *Core) error { return c.Unlock(nd[i]) }); err != nil {
		s.fatalf("unlock: %v", err)
	}
}

// flush is the driver's Flush on an idle group: the storage jobs still running (queries
// nobody waits for) are drained, every rank resets.
func (s *replicaSim) flush() {
	for i := range s.pending {
		if len(s.pending[i]) > 0 {
			s.fatalf("rank %d: the group is idle but transfers %+v are in flight", i, s.pending[i])
		}
	}
	for i := range s.jobs {
		for _, j := range s.jobs[i] {
			if j.Kind != StorageQuery {
				s.fatalf("the group is idle but storage %s %d of rank %d is in flight", j.Kind, j.Seq, i)
			}
		}
		s.jobs[i] = nil
	}
	if err := s.each("reset", func(_ int, c *Core) error { return c.Reset() }); err != nil {
		s.fatalf("reset of an idle group: %v", err)
	}
	// A lock a divergence dropped leaves the group idle, so a flush does not wait for its
	// request: the request still holds its handle and unlocks it later (accepted once).
	// Every other lock left is the root's (a no-op).
	s.locked = slices.DeleteFunc(s.locked, func(l []Handle) bool { return s.cores[0].dropped[l[0]] == 0 })
	s.pids, s.quar = nil, false // a flush ends a quarantine too
	s.counts["flush"]++
	s.checkFresh("flush")
}

// settle releases every lock and steps until the group is idle (and out of quarantine).
func (s *replicaSim) settle() {
	for len(s.locked) > 0 {
		s.unlockOne()
	}
	for _, id := range s.pids {
		s.each("revoke", func(_ int, c *Core) error { c.RevokePrefetch(id); return nil })
	}
	for k := 0; !s.cores[0].Idle() || s.quar; k++ {
		if k > 500 {
			s.fatalf("never idle: queues %+v, quarantined %t", s.cores[0].Queues(), s.quar)
		}
		s.step()
	}
}

func runReplicaSim(t testing.TB, seed uint64, ops int) map[string]int {
	s := newReplicaSim(t, seed)
	for range ops {
		for range 1 + s.rng.IntN(3) {
			s.op()
		}
		s.step()
	}
	s.settle()
	s.flush()
	s.checkEvents()
	return s.counts
}

// N replicas under random scheduler calls, random per-rank completion and failures, storage
// prefetches and backups, flushes and injected divergences keep identical state, never touch
// a page another rank may still copy, and come back fresh from every flush and recovery.
func TestReplicasRandomOps(t *testing.T) {
	total := map[string]int{}
	seeds := 300
	if testing.Short() {
		seeds = 60
	}
	for seed := range uint64(seeds) {
		for k, v := range runReplicaSim(t, seed, 150) {
			total[k] += v
		}
	}
	t.Logf("%v", total)
	for _, k := range []string{"insert", "loadback", "prefetch", "flush", "diverged", "recovered"} {
		if total[k] == 0 {
			t.Errorf("the workload never exercised %s: %v", k, total)
		}
	}
}

func FuzzReplicas(f *testing.F) {
	for seed := range uint64(8) {
		f.Add(seed, uint16(100))
	}
	f.Fuzz(func(t *testing.T, seed uint64, ops uint16) {
		runReplicaSim(t, seed, int(ops%400))
	})
}

func (s *replicaSim) tracef(format string, args ...any) {
	if len(s.trace) == 30 {
		s.trace = s.trace[1:]
	}
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
}
