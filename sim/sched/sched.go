package sched

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

// Counts are what one replica's scheduler measured; every rank of the replica counts
// the same values (they follow from replicated decisions).
type Counts struct {
	Requests     int64 `json:"requests"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	HitL1        int64 `json:"hit_l1"`
	HitL2        int64 `json:"hit_l2"`
	HitL3        int64 `json:"hit_l3"` // prompt tokens served from pages prefetched from storage
	Missed       int64 `json:"missed"`
	Steps        int64 `json:"steps"`
	Retries      int64 `json:"retries"` // admissions or finishes put off because L1 was full
	// PrefetchSteps are the scheduler steps made while a prefetch from storage was waited
	// for (included in Steps: each makes the one consensus step of a scheduler step).
	PrefetchSteps int64 `json:"prefetch_steps"`
	// LoadSteps are the scheduler steps made while a load-back from L2 was waited for (until
	// the group agreed it was over).
	LoadSteps int64 `json:"load_steps"`
	// With prefetches overlapping decode: PrefetchDeferrals are the steps × queued requests
	// whose prefetch waited for the budget (see prefetchBudget); PrefetchRetries the
	// prefetches asked again after the cache refused stored pages for a transient reason
	// (quota, L2 room, a changed tree, a duplicate read) or an unheld match lost pages;
	// PrefetchRefusedPages the stored pages still refused after maxPrefetchAttempts, or
	// lost while the cache could not ask storage (the circuit open), then computed;
	// PrefetchCutPages the stored pages a read did not bring (cut by the
	// PrefetchTimeout timer, revoked, or short: a storage error or a rejected page).
	PrefetchDeferrals    int64 `json:"prefetch_deferrals"`
	PrefetchRetries      int64 `json:"prefetch_retries"`
	PrefetchRefusedPages int64 `json:"prefetch_refused_pages"`
	// PrefetchRefusedBy breaks PrefetchRefusedPages down by cause.
	PrefetchRefusedBy report.RefusedPages `json:"prefetch_refused_by_cause"`
	PrefetchCutPages  int64               `json:"prefetch_cut_pages"`
	// PrefetchCostSkippedPages: whole prompt pages beyond a request's L1 and L2 hit that it
	// computed because the cache's cost rule found reading them from storage slower (stored
	// pages the group skipped, or a continuation not even asked about: see
	// hicache.PrefetchCost).
	PrefetchCostSkippedPages int64 `json:"prefetch_cost_skipped_pages"`
	// SettleSteps are the scheduler steps made while an insert or a load-back that found L1
	// full waited for the copies and storage operations in flight (see withRoom).
	SettleSteps int64 `json:"settle_steps"`
	// Flushes and FlushesRefused count the flushes --fault flush made and those the cache
	// refused because it was busy.
	Flushes        int64 `json:"flushes"`
	FlushesRefused int64 `json:"flushes_refused"`
	// OutputsChecked and OutputsDiffering count, with an Engine, the requests whose output
	// (generated tokens and final logits) was compared with the same request computed
	// without the cache, and those that differed.
	OutputsChecked   int64 `json:"outputs_checked,omitempty"`
	OutputsDiffering int64 `json:"outputs_differing,omitempty"`
}

// Local are this rank's own checks.
type Local struct {
	PagesVerified int64 `json:"pages_verified"`
	BadPages      int64 `json:"bad_pages"`
	PagesFilled   int64 `json:"pages_filled"`
	// LayerWaits are the layer-wise waits of load-backs (WaitL1Layer, one per layer of each
	// load-back) with a Layered L1.
	LayerWaits int64 `json:"layer_waits,omitempty"`
	// FlushCollectives are the collectives of --fault flush's Flush calls (a barrier, or the
	// agreement on idleness in quarantine, even when it refuses): not the steps' consensus.
	FlushCollectives int64 `json:"flush_collectives"`
}

// active is a request between its prefill and its last decoded token.
type active struct {
	req       workload.Request
	last      hicache.Handle // deepest node of the cached prompt, locked while running
	generated int
	pages     int // L1 slots of one rank reserved for it (prompt and answer: RankPagesOf)
}

// Scheduler runs one replica's requests through its rank's cache. Every rank of the
// replica runs the same scheduler on the same requests; every call it makes on the cache
// except WaitL1, L1Page and the KV writes and checks is a replicated decision, and every
// branch depends only on replicated results, so the ranks stay in lockstep.
//
// A scheduler step decodes one token of every running request (a request whose answer is
// complete is inserted with its answer, so that the next turn hits, and released), admits
// queued requests (prefill: match, lock, load L2 hits back and verify them, compute the
// missing pages, insert; the prefill produces the first token) within a token budget and
// the L1 pages left, then runs the cache's consensus step — exactly one per scheduler step.
//
// The fields a caller sets before Run are hooks: KV, Layered, Engine, Faults, Misses,
// Corrupt and AfterSchedule; Observe adds observers.
type Scheduler struct {
	cache Cache
	cfg   Config
	shard int // this rank's attention-TP index: which part of a page's KV it holds

	// KV is this rank's L1 pages (New: the cache's own, through Cache.L1Page).
	KV KV
	// Layered, if set, is this rank's L1 as per-layer chunks, used instead of KV: pages are
	// filled and checked chunk by chunk, and a load-back is waited for layer by layer
	// (WaitL1Layer, each layer checked as it lands) instead of as a whole (WaitL1).
	Layered LayeredKV
	// Engine, if set, does the compute (see Engine): the pages are its KV, not kvtest's
	// content, so loaded pages are not checked against kvtest but every request's output is
	// compared with the engine's cache-off output.
	Engine Engine
	// Faults runs the run's faults before each step (nil: none).
	Faults Faults
	// Misses attributes the misses (replica leaders; nil elsewhere): an observer whose
	// causes Timing reports.
	Misses *MissTracker
	// Corrupt (tests) damages an L2 page of the node before its load.
	Corrupt func(hicache.NodeInfo)
	// AfterSchedule (tests) runs in Run's loop after each step's decisions, before its
	// consensus step; it may make consensus steps of its own (Step).
	AfterSchedule func(context.Context) error

	observers []Observer

	queue    []workload.Request
	running  []*active
	reserved int          // L1 slots of one rank reserved by running requests
	blocked  map[int]bool // admit's scratch: clients with a turn running, reused every step

	counts   Counts
	local    Local
	firstBad error // the first bad page (or, with an Engine, differing output) this rank found

	clock      *vtime.Clock             // virtual time (replicated: it gates admissions)
	prefetches map[int]*pendingPrefetch // requests waiting in the queue for their prefetch, by ID
	// prefetchHeld is the weight (prompt pages) of the prefetches: at most prefetchBudget
	// unless only one is under way.
	prefetchHeld int
	deferred     map[int]bool // requests whose prefetch waited for the budget at the last admit
	costSkipped  map[int]bool // requests whose continuation the cost rule left to compute (see costSkip)
	roomEpoch    uint64       // admissions and finishes so far: L2 room may have changed since
	diverged     bool         // a divergence was seen: the group may be in quarantine

	// roomWanted: an insert or a load-back found L1 full in this step (roomWantedLast: in
	// the step before); then no waiting request holds its match (see holdsAllowed).
	roomWanted, roomWantedLast bool
	quietSteps                 int // steps in a row that moved nothing with nothing in flight
}

// New returns the scheduler of reqs (which it reorders by arrival in virtual time) over
// cache, for the rank of attention-TP index shard.
func New(cache Cache, cfg Config, shard int, reqs []workload.Request) *Scheduler {
	s := &Scheduler{cache: cache, KV: cacheKV{cache}, cfg: cfg, shard: shard, queue: reqs, blocked: map[int]bool{},
		prefetches: map[int]*pendingPrefetch{}, deferred: map[int]bool{}, costSkipped: map[int]bool{}}
	s.clock = vtime.NewClock(&s.cfg.Cost, cfg.Time, cfg.Speed)
	if s.clock.Virtual() {
		// Served in order of arrival (a trace is already; replicated either way).
		slices.SortStableFunc(s.queue, func(a, b workload.Request) int { return cmp.Compare(a.ArrivalMs, b.ArrivalMs) })
	}
	return s
}

// run serves every request, then steps until no backup or load is in flight.
func (s *Scheduler) run(ctx context.Context) error {
	for len(s.queue) > 0 || len(s.running) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.waitIdle()
		s.clock.BeginStep()
		progressed, err := s.schedule(ctx)
		if err != nil {
			return err
		}
		if s.AfterSchedule != nil {
			if err := s.AfterSchedule(ctx); err != nil {
				return err
			}
		}
		quiet := s.cache.Pending() == 0
		prefetched := len(s.prefetches) > 0
		// Admissions held for a flush when idle (see Faults.HoldsAdmissions): the
		// flush is made at a step below once nothing runs and nothing is in flight.
		held := s.holdsAdmissions(uint64(s.counts.Steps))
		if err := s.step(ctx); err != nil {
			return err
		}
		s.clock.EndStep()
		if progressed || !quiet {
			s.quietSteps = 0
			continue
		}
		// Nothing admitted, decoded or finished, and no I/O in flight whose completion could
		// free L1 or end a prefetch: no later step can do better, except while requests
		// wait for prefetches, whose holds and checks may take a few steps to settle (see
		// maxQuietSteps). Replicated (every input is), so every rank stops at the same step.
		if s.quietSteps++; (!prefetched && !held) || s.quietSteps >= maxQuietSteps {
			if held {
				return fmt.Errorf("sched: no progress: a flush:when=idle holds admissions and the cache is not idle after %d steps (%d running, %d queued requests waiting for prefetches)",
					s.quietSteps, len(s.running), len(s.prefetches))
			}
			return s.stalled()
		}
	}
	for s.cache.Pending() > 0 {
		if err := s.step(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (s *Scheduler) step(ctx context.Context) error {
	if s.Faults != nil {
		if err := s.Faults.BeforeStep(ctx, uint64(s.counts.Steps), &s.counts, &s.local); err != nil {
			return err
		}
	}
	err := s.cache.Step(ctx)
	s.counts.Steps++
	for _, o := range s.observers {
		o.Stepped(s.counts.Steps)
	}
	if errors.Is(err, hicache.ErrPlacementDiverged) {
		s.diverged = true
		if !s.cfg.Strict {
			// Every rank of the replica sees it at the same step: the cache quarantines (no
			// hits, no inserts, no slab I/O) and recovers by itself at the first idle step;
			// the report counts both. Under --strict the run fails here, on every rank alike.
			return nil
		}
	}
	return err
}

// maxQuietSteps bounds the steps in a row that move nothing, with nothing in flight, while
// requests wait for prefetches: settling what the reads brought (the holds taken), a
// prefill or a finish that then finds L1 full (the holds released), and its retry with no
// hold in the way take three; a run that still moves nothing is stalled, and fails saying
// so instead of stepping forever.
const maxQuietSteps = 8

func (s *Scheduler) stalled() error {
	if len(s.queue) > 0 {
		r := s.queue[0]
		waiting := ""
		if n := len(s.prefetches); n > 0 {
			waiting = fmt.Sprintf(" and %d queued requests waiting for prefetches", n)
		}
		return fmt.Errorf("sched: no progress: request %d (%d prompt + %d output tokens, %d pages) does not fit in L1 of %d pages per rank (%d of them on rank 0) with %d running%s",
			r.ID, len(r.Tokens), r.OutputLen, s.cfg.PagesOf(r), s.cfg.L1Pages, s.cfg.RankPagesOf(r), len(s.running), waiting)
	}
	return fmt.Errorf("sched: no progress: %d running requests cannot insert their answers into L1 of %d pages per rank", len(s.running), s.cfg.L1Pages)
}

// schedule makes one step's decisions: one decoded token per running request (finishing
// those whose answer is complete), then admissions. It reports whether anything moved.
func (s *Scheduler) schedule(ctx context.Context) (bool, error) {
	s.roomWantedLast, s.roomWanted = s.roomWanted, false
	if s.overlapPrefetch() {
		if err := s.holdPrefetched(); err != nil {
			return false, err
		}
	}
	decoded, err := s.decode(ctx)
	if err != nil {
		return false, err
	}
	admitted, err := s.admit(ctx)
	if err != nil {
		return false, err
	}
	return admitted+decoded > 0, nil
}

// admit prefills queued requests in order while the token budget, the L1 reservation and
// the running limit allow. A conversation's turn waits until its previous turn finished.
func (s *Scheduler) admit(ctx context.Context) (int, error) {
	if s.holdsAdmissions(uint64(s.counts.Steps)) {
		// Nothing is admitted, and the waiting requests' holds go (they are matched again
		// at their prefill), so that the cache goes idle for the flush.
		return 0, s.releaseHolds()
	}
	blocked := s.blocked
	clear(blocked)
	clear(s.deferred)
	for _, a := range s.running {
		if a.req.Client >= 0 {
			blocked[a.req.Client] = true
		}
	}
	budget, admitted, stop := s.cfg.BatchTokens, 0, false
	keep := s.queue[:0]
	for _, r := range s.queue {
		if !stop && r.Client >= 0 && blocked[r.Client] {
			keep = append(keep, r)
			continue
		}
		if s.Engine != nil {
			var err error
			if r, err = s.Engine.Prompt(r); err != nil {
				return admitted, err
			}
		}
		if !stop && !s.clock.Arrived(r) {
			stop = true // the queue is in arrival order: nothing after r has arrived either
		}
		// A prefetch asked at an earlier step is looked at even after a stop: once the cache
		// has read it, its lock on the prompt's prefix goes (prefetchWaits), which may be
		// the L1 room that the request before it waits for.
		if s.overlapPrefetch() && (!stop || s.prefetches[r.ID] != nil) {
			waiting, err := s.prefetchWaits(r)
			if err != nil {
				return admitted, err
			}
			if waiting || stop { // its prefetch is under way: the others go on
				keep = append(keep, r)
				if r.Client >= 0 {
					// Its conversation's next turns wait for it: they are not admitted
					// before it, nor ask storage for a history without its answer.
					blocked[r.Client] = true
				}
				continue
			}
		}
		need := s.cfg.RankPagesOf(r)
		if stop || !s.cfg.Fits(r, need, admitted, budget, len(s.running), s.reserved) {
			stop = true
			keep = append(keep, r)
			continue
		}
		a, err := s.prefill(ctx, r)
		if err != nil {
			return admitted, err
		}
		if a == nil { // L1 full for now: retry at a later step
			s.counts.Retries++
			if err := s.wantRoom(); err != nil {
				return admitted, err
			}
			stop = true
			keep = append(keep, r)
			continue
		}
		admitted++
		if err := s.admitted(r); err != nil {
			return admitted, err
		}
		budget -= len(r.Tokens)
		if r.Client >= 0 {
			blocked[r.Client] = true
		}
		a.pages = need
		s.reserved += need
		if r.OutputLen > 0 {
			a.generated = 1 // the prefill produces the first token
		}
		s.running = append(s.running, a)
	}
	clear(s.queue[len(keep):])
	s.queue = keep
	return admitted, nil
}

// prefill matches r's prompt, loads its L2 hit back and verifies it, computes the missing
// pages and inserts the prompt. It returns nil (and holds nothing) when L1 cannot make room
// now.
func (s *Scheduler) prefill(ctx context.Context, r workload.Request) (*active, error) {
	m, stored, err := s.match(ctx, r)
	if err != nil {
		return nil, err
	}
	for _, o := range s.observers {
		o.Matched(r, m)
	}
	after := m
	if m.HostPages > 0 {
		if after, err = s.loadBack(ctx, r, m); err != nil {
			return nil, err
		}
	}
	device := after.DevicePages
	if s.Engine != nil {
		if err := s.computePrompt(ctx, r, m, after); err != nil {
			return nil, errors.Join(err, s.cache.Unlock(m.Last))
		}
	}
	last, ok, err := s.insertPrompt(ctx, r, m)
	if err != nil || !ok {
		return nil, err
	}
	s.prefilled(r, m, device, stored)
	return &active{req: r, last: last}, nil
}

// match matches r's prompt and locks the match. With storage and prefetches not
// overlapping decode, it prefetches the prompt's continuation beyond the L1 and L2 hit and
// matches again; the prefetched pages are host pages, loaded back and verified like any. It
// returns the locked match and the page range [from, to) of the prompt that came from
// storage.
func (s *Scheduler) match(ctx context.Context, r workload.Request) (hicache.MatchResult, [2]int, error) {
	c := s.cache
	m, err := c.Match(cacheRequest(r))
	if err != nil {
		return m, [2]int{}, err
	}
	if err := c.Lock(m.Last); err != nil {
		return m, [2]int{}, err
	}
	if pf := s.prefetches[r.ID]; pf != nil {
		return m, pf.pages, nil
	}
	if s.cfg.Storage && !s.overlapPrefetch() && (m.DevicePages+m.HostPages)*s.cfg.PageSize < len(r.Tokens) {
		return s.prefetch(ctx, r, m)
	}
	return m, [2]int{}, nil
}

// loadBack loads the host pages of r's locked match m back into L1 and verifies the pages
// this rank owns (with an Engine, the engine's prefill waits for them layer by layer
// instead); it returns the match of the prompt after the load.
func (s *Scheduler) loadBack(ctx context.Context, r workload.Request, m hicache.MatchResult) (hicache.MatchResult, error) {
	c, P := s.cache, s.cfg.PageSize
	if s.Corrupt != nil {
		if info, err := c.Node(m.Last); err == nil {
			s.Corrupt(info)
		}
	}
	// A load-back loads at most the cache's load quota (LoadQuotaPages, half of the group's L1 by
	// default) of a longer host hit: load again while it moves the hit on, so that a
	// hit from L2 or storage is served whole instead of computed beyond the quota.
	after, loaded := m, -1
	for after.HostPages > 0 && after.DevicePages > loaded {
		loaded = after.DevicePages
		err := s.withRoom(ctx, func() error { _, err := c.LoadBack(m.Last); return err })
		if err != nil && !errors.Is(err, hicache.ErrL1Full) {
			return m, errors.Join(err, c.Unlock(m.Last))
		}
		// The loads start at the next step (after the Apply that checks the state they
		// were chosen from). Wait until the group agrees they are over: a copy that
		// failed on any rank is then stale on every rank, and the match below is the
		// same everywhere.
		for c.LoadPending(m.Last) {
			if err := s.step(ctx); err != nil {
				return m, errors.Join(err, c.Unlock(m.Last))
			}
			s.counts.LoadSteps++
		}
		if after, err = c.Match(cacheRequest(r)); err != nil {
			return m, err
		}
	}
	if s.Engine != nil {
		return after, nil
	}
	hashes := hicache.KeyPrefixHashes(r.Key, r.Tokens[:after.DevicePages*P], P)
	if s.Layered != nil {
		if err := s.verifyLayers(ctx, r, m, after, hashes); err != nil {
			return m, errors.Join(err, c.Unlock(m.Last))
		}
		return after, nil
	}
	if err := c.WaitL1(ctx, after.Last); err != nil {
		return m, errors.Join(fmt.Errorf("sched: request %d: %w", r.ID, err), c.Unlock(m.Last))
	}
	for i := m.DevicePages; i < after.DevicePages; i++ {
		if c.Owns(i) {
			s.verify(r, i, after.L1Slots[i], hashes[i].Index())
		}
	}
	return after, nil
}

// verifyLayers is the layer-wise form of loadBack's wait and check: for each layer it waits
// until that layer of the loads on the prefix landed (WaitL1Layer), then "computes" it: it
// checks that layer's chunks of every page this rank owns among those the load-back brought
// (match m's device pages to after's). A page with a bad chunk in any layer is one bad page.
func (s *Scheduler) verifyLayers(ctx context.Context, r workload.Request, m, after hicache.MatchResult, hashes []hicache.PageID) error {
	c := s.cache
	var owned []int
	for i := m.DevicePages; i < after.DevicePages; i++ {
		if c.Owns(i) {
			owned = append(owned, i)
		}
	}
	if after.DevicePages == m.DevicePages {
		return nil // nothing loaded (the L1 had no room): nothing to wait for
	}
	bad := make([]error, len(owned))
	for layer := range s.Layered.Layers() {
		if err := c.WaitL1Layer(ctx, after.Last, layer); err != nil {
			return fmt.Errorf("sched: request %d: layer %d: %w", r.ID, layer, err)
		}
		s.local.LayerWaits++
		for k, i := range owned {
			if bad[k] == nil {
				bad[k] = s.Layered.CheckLayer(after.L1Slots[i], layer, hashes[i].Index(), i, s.shard)
			}
		}
	}
	for k, i := range owned {
		s.checked(r, i, bad[k])
	}
	return nil
}

// insertPrompt inserts r's prompt, computes the pages this rank owns of what it missed,
// and moves the lock from the match m to the inserted prompt, whose last node it returns.
// It reports false (and holds nothing) when L1 cannot make room now.
func (s *Scheduler) insertPrompt(ctx context.Context, r workload.Request, m hicache.MatchResult) (hicache.Handle, bool, error) {
	c := s.cache
	var ins hicache.InsertResult
	err := s.withRoom(ctx, func() (err error) { ins, err = c.Insert(cacheRequest(r)); return err })
	if errors.Is(err, hicache.ErrL1Full) {
		return 0, false, c.Unlock(m.Last)
	}
	if err != nil {
		return 0, false, errors.Join(err, c.Unlock(m.Last))
	}
	if err := s.fill(r, ins.Fill); err != nil {
		return 0, false, err
	}
	s.backedUp(len(ins.Fill))
	if err := c.Lock(ins.Last); err != nil {
		return 0, false, err
	}
	if err := c.Unlock(m.Last); err != nil {
		return 0, false, err
	}
	return ins.Last, true, nil
}

// prefilled accounts r's prefill: its match m, the device pages it was served and the page
// range stored of the prompt that came from storage. Served pages that were prefetched from
// storage for this request are storage hits (some may have reached L1 before its prefill);
// the others L1 or L2 hits. It counts them, charges the clock and tells the observers.
func (s *Scheduler) prefilled(r workload.Request, m hicache.MatchResult, device int, stored [2]int) {
	P := s.cfg.PageSize
	overlap := func(from, to int) int { return max(0, min(to, stored[1])-max(from, stored[0])) }
	l3 := int64(overlap(0, device) * P)
	l1 := int64((m.DevicePages - overlap(0, m.DevicePages)) * P)
	l2 := int64(device*P) - l1 - l3
	s.counts.Requests++
	s.counts.InputTokens += int64(len(r.Tokens))
	s.counts.HitL1 += l1
	s.counts.HitL2 += l2
	s.counts.HitL3 += l3
	s.counts.Missed += int64(len(r.Tokens)) - l1 - l2 - l3
	s.clock.Prefilled(r, l1, l2, l3)
	s.clock.Loaded(device - m.DevicePages)
	p := Prefill{Request: r, Matched: m.DevicePages + m.HostPages, Served: device, L1: l1, L2: l2, L3: l3,
		CostSkipped: s.prefillCost(r, device), Diverged: s.diverged}
	if p.Diverged && len(s.observers) > 0 { // only then can the group be in quarantine
		p.Quarantined = s.cache.Quarantined()
	}
	for _, o := range s.observers {
		o.Prefilled(p)
	}
}

// prefetch asks storage for r's continuation beyond match m (whose last node the caller
// locked) and steps until the group has inserted what it read, then matches again: it
// returns the new match (its last node locked instead of m's) and the page range of the
// prompt that the prefetch added. The steps it makes are scheduler steps (one consensus
// collective each): running requests decode nothing in them, as in a synchronous
// scheduler that fetches before the prefill.
func (s *Scheduler) prefetch(ctx context.Context, r workload.Request, m hicache.MatchResult) (hicache.MatchResult, [2]int, error) {
	c := s.cache
	delete(s.costSkipped, r.ID)
	res, err := c.Prefetch(cacheRequest(r))
	if err != nil {
		return m, [2]int{}, errors.Join(err, c.Unlock(m.Last))
	}
	if res.CostSkipped {
		s.costSkip(r)
	}
	if res.ID == 0 {
		return m, [2]int{}, nil
	}
	asked := s.clock.NowNs()
	for c.PrefetchPending(res.ID) {
		if err := s.step(ctx); err != nil {
			return m, [2]int{}, errors.Join(err, c.Unlock(m.Last))
		}
		s.counts.PrefetchSteps++
	}
	if out, ok := c.PrefetchOutcome(res.ID); ok && out.Refused == hicache.RefusedCost {
		s.costSkip(r)
	}
	after, err := c.Match(cacheRequest(r))
	if err != nil {
		return m, [2]int{}, errors.Join(err, c.Unlock(m.Last))
	}
	if err := c.Lock(after.Last); err != nil {
		return m, [2]int{}, errors.Join(err, c.Unlock(m.Last))
	}
	if err := c.Unlock(m.Last); err != nil {
		return after, [2]int{}, errors.Join(err, c.Unlock(after.Last))
	}
	from, to := m.DevicePages+m.HostPages, after.DevicePages+after.HostPages
	// Everything waits until the storage read is over in virtual time.
	s.clock.AdvanceTo(s.clock.StorageReady(asked, max(to-from, 0)))
	return after, [2]int{from, max(from, to)}, nil
}

// withRoom calls try, an insert or a load-back, and while it fails for want of L1 room with
// copies or storage operations in flight, steps until none is (an eviction frees a page only
// once its copy is over; under write_back the failed call itself started the backups of
// its victims) and calls it again. It returns try's last error.
//
// When the group agrees that a copy is over depends on how fast the host copies, not on any
// replicated decision. Giving up at once and retrying at later steps would make how many
// steps (each decoding the running requests, charged a decode step) and which pages could
// be evicted meanwhile follow the host's speed, and hits per tier, misses by cause and
// every virtual time differ from one run of the same job to the next. In the cost
// model a step lasts as long as its backups (see vtime.CostProfile), so they are over by the next
// step: the steps withRoom makes decode nothing and are not charged to the virtual clock,
// like the steps a load-back waits in. Replicated: Pending is, so every rank makes the same
// steps.
func (s *Scheduler) withRoom(ctx context.Context, try func() error) error {
	err := try()
	for errors.Is(err, hicache.ErrL1Full) && s.cache.Pending() > 0 {
		for s.cache.Pending() > 0 {
			if serr := s.step(ctx); serr != nil {
				return serr
			}
			s.counts.SettleSteps++
		}
		err = try()
	}
	return err
}

// verify checks the KV of sequence page i that this rank loaded back into L1 slot.
func (s *Scheduler) verify(r workload.Request, i int, slot int32, hash uint64) {
	b, err := s.KV.Read(slot)
	if err == nil {
		err = kvtest.CheckKV(b, hash, i, s.shard)
	}
	s.checked(r, i, err)
}

// checked counts the check of sequence page i of r (err: what was wrong with it, or nil).
func (s *Scheduler) checked(r workload.Request, i int, err error) {
	s.local.PagesVerified++
	if err != nil {
		s.local.BadPages++
		for _, o := range s.observers {
			o.BadPage()
		}
		if s.firstBad == nil {
			s.firstBad = fmt.Errorf("request %d: page %d loaded from L2 is wrong: %w", r.ID, i, err)
		}
	}
}

// fill "computes" the KV of the pages this rank owns: bytes derived from the page's prefix
// hash, position and this rank's shard.
func (s *Scheduler) fill(r workload.Request, pages []hicache.FillPage) error {
	for _, f := range pages {
		if !s.cache.Owns(f.Index) {
			continue
		}
		var err error
		switch {
		case s.Engine != nil:
			err = s.Engine.FillPage(r, f.Slot, f.Index)
		case s.Layered != nil:
			err = s.Layered.FillPage(f.Slot, f.Hash.Index(), f.Index, s.shard)
		default:
			err = s.KV.Fill(f.Slot, func(b []byte) { kvtest.FillKV(b, f.Hash.Index(), f.Index, s.shard) })
		}
		if err != nil {
			return err
		}
		s.local.PagesFilled++
	}
	return nil
}

// decode generates one token of every running request; a request whose answer is complete
// is inserted with its answer and released (or retried at the next step when L1 is full).
func (s *Scheduler) decode(ctx context.Context) (int, error) {
	moved := 0
	keep := s.running[:0]
	for _, a := range s.running {
		if a.generated < a.req.OutputLen {
			if s.Engine != nil {
				if err := s.Engine.Decode(ctx, a.req); err != nil {
					return moved, err
				}
			}
			a.generated++
			moved++
			s.clock.Decoded()
		}
		if a.generated < a.req.OutputLen {
			keep = append(keep, a)
			continue
		}
		done, err := s.finish(ctx, a)
		if err != nil {
			return moved, err
		}
		if !done {
			s.counts.Retries++
			if err := s.wantRoom(); err != nil {
				return moved, err
			}
			keep = append(keep, a)
			continue
		}
		moved++
	}
	clear(s.running[len(keep):])
	s.running = keep
	return moved, nil
}

// finish inserts the prompt with its answer so that the next turn hits, and releases the
// request. It returns false when L1 is full for now.
func (s *Scheduler) finish(ctx context.Context, a *active) (bool, error) {
	r := a.req
	full := append(r.Tokens[:len(r.Tokens):len(r.Tokens)], s.answer(r)...)
	var ins hicache.InsertResult
	err := s.withRoom(ctx, func() (err error) { ins, err = s.cache.Insert(hicache.Request{Tokens: full, Key: r.Key}); return err })
	if errors.Is(err, hicache.ErrL1Full) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := s.fill(r, ins.Fill); err != nil {
		return false, err
	}
	s.backedUp(len(ins.Fill))
	for _, o := range s.observers {
		o.Finished(r)
	}
	if s.Engine != nil { // after the observers: Finish forgets r's answer
		diff, err := s.Engine.Finish(ctx, r)
		if err != nil {
			return false, err
		}
		s.outputChecked(diff)
	}
	if err := s.cache.Unlock(a.last); err != nil {
		return false, err
	}
	s.reserved -= a.pages
	s.roomEpoch++
	s.counts.OutputTokens += int64(r.OutputLen)
	return true, nil
}
