package sched

import (
	"context"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

// Cache is what the scheduler calls on its rank's cache (*hicache.Cache implements it).
type Cache interface {
	Match(r hicache.Request) (hicache.MatchResult, error)
	Insert(r hicache.Request) (hicache.InsertResult, error)
	Lock(h hicache.Handle) error
	Unlock(h hicache.Handle) error
	LoadBack(h hicache.Handle) (hicache.LoadResult, error)
	LoadPending(h hicache.Handle) bool
	WaitL1(ctx context.Context, h hicache.Handle) error
	WaitL1Layer(ctx context.Context, h hicache.Handle, layer int) error
	Node(h hicache.Handle) (hicache.NodeInfo, error)
	Owns(i int) bool
	L1Page(slot int32) ([]byte, error)
	Prefetch(r hicache.Request) (hicache.PrefetchResult, error)
	PrefetchPending(id uint64) bool
	PrefetchOutcome(id uint64) (hicache.PrefetchOutcome, bool)
	PrefetchQuotaPages() int
	PrefetchSkipsForCost(r hicache.Request) bool
	Pending() int
	Quarantined() bool
	Step(ctx context.Context) error
}

// cacheRequest is r's prompt as the cache sees it: its tokens under its isolation key.
func cacheRequest(r workload.Request) hicache.Request {
	return hicache.Request{Tokens: r.Tokens, Key: r.Key}
}

// Config is what the scheduler's rules depend on.
type Config struct {
	PageSize int // tokens per page
	L1Pages  int // L1 of each of the replica's ranks, in page slots (its pool)
	// CPRanks is the CP group's size C (0: 1): a rank's L1 holds only the pages it owns
	// (page i on CP rank i mod C), so a request of n pages takes ⌈n/C⌉ slots of rank 0,
	// the rank holding the most of it (see RankPagesOf).
	CPRanks     int
	BatchTokens int // prompt tokens admitted per step (the first admission may exceed it)
	MaxRunning  int // requests running at once
	// Storage: the cache has an L3 tier; a prompt continuing beyond its L1 and L2 hit is
	// prefetched, overlapping decode unless PrefetchSync (then the scheduler waits for it
	// in steps where nothing decodes).
	Storage      bool
	PrefetchSync bool
	Policy       hicache.Policy // the cache's write policy (write_back backups are not charged)
	// Strict: a placement divergence fails the run instead of being quarantined.
	Strict bool
	// The virtual clock: the time mode (vtime.Virtual or vtime.None), the speed arrivals
	// are divided by and the step costs.
	Time  string
	Speed float64
	Cost  vtime.CostModel
}

// PagesOf is the number of L1 pages a request occupies at most: its prompt and answer
// rounded up to whole pages.
func (c *Config) PagesOf(r workload.Request) int {
	return (len(r.Tokens) + r.OutputLen + c.PageSize - 1) / c.PageSize
}

// RankPagesOf is the number of L1 slots a request occupies at most on one rank: PagesOf
// spread over the CP group's ranks, rounded up (rank 0 owns page 0, so it holds the most).
func (c *Config) RankPagesOf(r workload.Request) int {
	C := max(c.CPRanks, 1)
	return (c.PagesOf(r) + C - 1) / C
}

// Fits is the scheduler's admission rule: r, needing need L1 slots of one rank (RankPagesOf), enters this step after
// admitted requests (budget prompt tokens left) beside running requests that reserve
// reserved slots of one rank. The first admission of a step may exceed the budget, and a replica with
// nothing running or admitted takes any request (the caller made sure L1 holds the
// largest).
func (c *Config) Fits(r workload.Request, need, admitted, budget, running, reserved int) bool {
	busy := admitted > 0 || running > 0
	return (admitted == 0 || len(r.Tokens) <= budget) && running < c.MaxRunning && (!busy || reserved+need <= c.L1Pages)
}

// KV is the scheduler's view of this rank's L1 pages: it writes the KV it "computes" into a
// slot (Fill) and reads a loaded slot to check it (Read).
type KV interface {
	Fill(slot int32, write func([]byte)) error
	Read(slot int32) ([]byte, error)
}

// LayeredKV is this rank's L1 as per-layer chunks (the engine's KV memory, kvmem.L1): the
// scheduler writes the KV it "computes" chunk by chunk (FillPage: every layer and part of the
// page) and, after a load-back, checks layer i (CheckLayer) once WaitL1Layer says it landed,
// as a forward pass starts layer i's attention while later layers still copy.
type LayeredKV interface {
	Layers() int
	FillPage(slot int32, pageHash uint64, index, shard int) error
	CheckLayer(slot int32, layer int, pageHash uint64, index, shard int) error
}

// cacheKV is L1 as the cache's own pages (Cache.L1Page: host memory).
type cacheKV struct{ c Cache }

func (h cacheKV) Fill(slot int32, write func([]byte)) error {
	b, err := h.c.L1Page(slot)
	if err == nil {
		write(b)
	}
	return err
}

func (h cacheKV) Read(slot int32) ([]byte, error) { return h.c.L1Page(slot) }

// Faults are the faults a run injects at scheduler steps.
type Faults interface {
	// HoldsAdmissions reports whether nothing is admitted at step (a flush waits for the
	// cache to go idle). Replicated.
	HoldsAdmissions(step uint64) bool
	// BeforeStep runs the faults due before step, counting the flushes it made in counts
	// and their collectives in local.
	BeforeStep(ctx context.Context, step uint64, counts *Counts, local *Local) error
}

// Prefill is what one request's prefill was served.
type Prefill struct {
	Request workload.Request
	Matched int // prompt pages its match found in the cache (L1 or L2), after any prefetch
	Served  int // prompt pages served from L1 after the load-back
	// Prompt tokens hit per tier (L3: pages prefetched from storage for it).
	L1, L2, L3 int64
	// CostSkipped: the prompt's continuation beyond its hit was computed because the cost
	// rule found reading it from storage slower.
	CostSkipped bool
	// Diverged: a divergence was seen in the run, so the group may be in quarantine;
	// Quarantined: it is (only asked when Diverged).
	Diverged, Quarantined bool
}

// Observer is told what the scheduler did, at a few points; it decides nothing.
type Observer interface {
	// Matched: r's prompt matched m in the cache, before its L2 hit is loaded back (a
	// prefill that then finds L1 full is matched again later).
	Matched(r workload.Request, m hicache.MatchResult)
	// Prefilled: a request was admitted.
	Prefilled(p Prefill)
	// Finished: r's prompt and answer were inserted; it is released.
	Finished(r workload.Request)
	// Stepped: the scheduler made its steps-th step.
	Stepped(steps int64)
	// BadPage: a page loaded back into L1 failed its check.
	BadPage()
}

// OnPrefilled is an Observer told only each request's prompt tokens served from the cache.
type OnPrefilled func(r workload.Request, hitTokens int64)

func (f OnPrefilled) Matched(workload.Request, hicache.MatchResult) {}
func (f OnPrefilled) Prefilled(p Prefill)                           { f(p.Request, p.L1+p.L2+p.L3) }
func (f OnPrefilled) Finished(workload.Request)                     {}
func (f OnPrefilled) Stepped(int64)                                 {}
func (f OnPrefilled) BadPage()                                      {}

// Observe adds o to the observers.
func (s *Scheduler) Observe(o Observer) { s.observers = append(s.observers, o) }

// Run serves every request, then steps until no backup or load is in flight.
func (s *Scheduler) Run(ctx context.Context) error {
	if s.Misses != nil {
		if s.Engine != nil {
			s.Misses.answer = s.Engine.Answer
		}
		s.observers = append([]Observer{s.Misses}, s.observers...)
	}
	return s.run(ctx)
}

// Step makes one scheduler step's consensus step (with its faults).
func (s *Scheduler) Step(ctx context.Context) error { return s.step(ctx) }

// Counts are the replica's counts so far.
func (s *Scheduler) Counts() Counts { return s.counts }

// Local are this rank's checks so far.
func (s *Scheduler) Local() Local { return s.local }

// FirstBad is the first bad page this rank found (nil: none).
func (s *Scheduler) FirstBad() error { return s.firstBad }

// Running is the number of requests running.
func (s *Scheduler) Running() int { return len(s.running) }

// Prefetches are the requests waiting for their prefetch and the weight (prompt pages)
// they hold.
func (s *Scheduler) Prefetches() (waiting, held int) { return len(s.prefetches), s.prefetchHeld }

// PrefetchesReading counts the waiting requests whose prefetch the group has not agreed
// over yet.
func (s *Scheduler) PrefetchesReading() int {
	n := 0
	for _, pf := range s.prefetches {
		if pf.id != 0 && s.cache.PrefetchPending(pf.id) {
			n++
		}
	}
	return n
}

// Timing is what the scheduler's leader reports: its clock's timings and its miss causes.
func (s *Scheduler) Timing() *report.ReplicaTiming {
	t := report.TimingOf(s.clock)
	if s.Misses != nil {
		t.Misses = s.Misses.Causes()
	}
	return &t
}

// holdsAdmissions reports whether the faults hold admissions at the current step.
func (s *Scheduler) holdsAdmissions(step uint64) bool {
	return s.Faults != nil && s.Faults.HoldsAdmissions(step)
}
