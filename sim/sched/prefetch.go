package sched

import (
	"errors"
	"maps"
	"math"
	"slices"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/workload"
)

// pendingPrefetch is a queued request's prefetch from storage. The request waits in the
// queue, and everything else keeps running, until the cache inserted what the prefetch
// read and the virtual clock passed the modelled read time (as in SGLang's HiCache, where
// a request whose prefetch is under way is not scheduled yet). From the end of the read to
// the request's prefill the prompt's match stays locked (held), so that what was read is
// still there to serve, except while L1 room is wanted (see holdsAllowed).
type pendingPrefetch struct {
	id       uint64         // the cache's last prefetch for the request, until its outcome is taken (0: none)
	locked   hicache.Handle // locked: the prefix while the cache reads, then the match it read (the hold)
	askedNs  float64        // virtual time the first prefetch was asked
	readyNs  float64        // NaN until the cache finished and its outcome was taken (settle)
	pages    [2]int         // page range [from, to) of the prompt the prefetches added
	weight   int            // pages of the prompt: what it may hold in L2 (see prefetchBudget)
	attempts int            // prefetches asked again after a refusal or a lost hold
	// recheck: the match is not held (its hold was released, or room was wanted when it
	// would have been taken): it is matched again before the prefill, and what it lost
	// meanwhile is fetched again.
	recheck bool
	epoch   uint64 // Scheduler.roomEpoch at the last retry
}

// costSkip records that r's continuation beyond its L1 and L2 hit is computed because the
// cache's cost rule found reading it slower (counted at r's prefill: prefillCost).
func (s *Scheduler) costSkip(r workload.Request) { s.costSkipped[r.ID] = true }

// prefillCost counts, at r's prefill, the whole prompt pages beyond the device pages it was
// served that were computed because reading them was slower (PrefetchCostSkippedPages), and
// reports whether there were any such.
func (s *Scheduler) prefillCost(r workload.Request, device int) bool {
	if !s.costSkipped[r.ID] {
		return false
	}
	delete(s.costSkipped, r.ID)
	s.counts.PrefetchCostSkippedPages += int64(max(len(r.Tokens)/s.cfg.PageSize-device, 0))
	return true
}

// maxPrefetchAttempts bounds how often one request's prefetch is asked again after the
// cache refused stored pages for a transient reason (quota, L2 room, a changed tree, a
// duplicate read) or its hold was released: past it, the refused pages are computed and
// counted (Counts.PrefetchRefusedPages), never silently.
const maxPrefetchAttempts = 8

// overlapPrefetch says whether prefetches overlap decoding (else the scheduler waits for
// them in steps where nothing decodes).
func (s *Scheduler) overlapPrefetch() bool {
	return s.cfg.Storage && !s.cfg.PrefetchSync
}

// prefetchBudget is how many prompt pages the requests waiting for prefetches may hold: the
// cache's prefetch quota. Without it every queued request asked at once (all of a synthetic
// run's conversations, arrived at 0): their locked prefixes filled L2, the cache refused
// the reads for want of room or quota, and the requests computed what storage held. Within
// it the reads fit the quota and the held pages leave L2 room to read into.
func (s *Scheduler) prefetchBudget() int {
	return max(s.cache.PrefetchQuotaPages(), 1)
}

// prefetchWaits starts r's prefetch when its prompt continues beyond its L1 and L2 hit, and
// reports whether r must keep waiting for it. A request whose prefetch would pass the
// budget while others are under way waits for them to be admitted first (it keeps its place:
// the queue is served in order). Replicated: every branch follows from the cache's
// replicated answers and the replicated clock.
func (s *Scheduler) prefetchWaits(r workload.Request) (bool, error) {
	c, P := s.cache, s.cfg.PageSize
	pf := s.prefetches[r.ID]
	if pf == nil {
		w := len(r.Tokens) / P
		if len(s.prefetches) > 0 && s.prefetchHeld+w > s.prefetchBudget() {
			if c.PrefetchSkipsForCost(cacheRequest(r)) {
				s.costSkip(r) // nothing to wait for: it computes its continuation
				return false, nil
			}
			m, err := c.Match(cacheRequest(r))
			if err != nil {
				return false, err
			}
			if (m.DevicePages+m.HostPages)*P >= len(r.Tokens) {
				return false, nil // nothing to fetch
			}
			s.counts.PrefetchDeferrals++
			s.deferred[r.ID] = true
			return true, nil
		}
		pf = &pendingPrefetch{askedNs: s.clock.NowNs(), readyNs: math.NaN(), pages: [2]int{-1, -1}, weight: w}
		started, err := s.askPrefetch(r, pf)
		if err != nil || !started {
			return false, err
		}
		delete(s.costSkipped, r.ID)
		s.prefetches[r.ID] = pf
		s.prefetchHeld += w
	}
	if pf.id != 0 && c.PrefetchPending(pf.id) {
		return true, nil // the cache is reading
	}
	if math.IsNaN(pf.readyNs) || pf.recheck && (s.holdsAllowed() || s.clock.NowNs() >= pf.readyNs) {
		if waiting, err := s.settle(r, pf); err != nil || waiting {
			return waiting, err
		}
	}
	return s.clock.NowNs() < pf.readyNs, nil
}

// settle takes the outcome of r's prefetch once the cache is done with it (or matches r
// again after its hold was lost): it unlocks what pf locked, asks storage again for what is
// missing (retryPrefetch) or takes what the tree holds: the match is held until the prefill
// when holds are allowed, else pf is left to recheck. It reports whether r waits for a
// prefetch asked again or for the room to change. Replicated.
func (s *Scheduler) settle(r workload.Request, pf *pendingPrefetch) (bool, error) {
	c, P := s.cache, s.cfg.PageSize
	if pf.locked != 0 {
		if err := c.Unlock(pf.locked); err != nil {
			return false, err
		}
		pf.locked = 0
	}
	m, err := c.Match(cacheRequest(r))
	if err != nil {
		return false, err
	}
	have := m.DevicePages + m.HostPages
	if have*P < len(r.Tokens) {
		switch retry, missing := s.retryPrefetch(r, pf, have); retry {
		case retryWait:
			return true, nil
		case retryAsk:
			pf.id = 0
			started, err := s.askPrefetch(r, pf)
			if err != nil {
				return false, err
			}
			if started {
				pf.readyNs, pf.recheck = math.NaN(), false // settled again once read
				return true, nil
			}
			// The cache asks storage nothing now (the storage circuit open, quarantine):
			// what the tree lost is computed, and counted (skipped for cost at the prefill
			// when the cost rule is why).
			if !s.costSkipped[r.ID] {
				s.refused(int64(missing), &s.counts.PrefetchRefusedBy.NotAsked)
			}
		}
	}
	pf.id = 0 // the outcome is taken: a later recheck counts only what the tree lost
	pf.pages[1] = max(pf.pages[1], have)
	pf.readyNs = s.clock.StorageReady(pf.askedNs, pf.pages[1]-pf.pages[0])
	pf.recheck = !s.holdsAllowed()
	if pf.recheck {
		return false, nil
	}
	// Hold what was read until the prefill (admitted unlocks it).
	if err := c.Lock(m.Last); err != nil {
		return false, err
	}
	pf.locked = m.Last
	return false, nil
}

// What retryPrefetch decides.
const (
	retryNo   = iota // take what the tree holds
	retryAsk         // ask storage again
	retryWait        // wait for the room to change, then decide again
)

// retryPrefetch decides, once pf's prefetch is over and the tree holds have leading pages
// of the prompt (short of all of it), whether to ask storage again, and accounts the stored
// pages it gives up: a read cut by the timer or revoked, or short, is not asked again
// (PrefetchCutPages); pages refused for a transient reason (quota, L2 room, a changed tree, a
// duplicate read), read but lost before the hold, or lost while the match was not held, are
// asked for again once the room may have changed (an admission or a finish since the last
// try, or at once when nothing runs or is in flight), at most maxPrefetchAttempts times
// (then PrefetchRefusedPages). A read that gained pages asks for the rest (prefetches of a
// shared prefix asked together are read once; the quota clamps a long read). It returns
// the decision and, for a retry, how many stored pages the tree lacks (0 when it asks for
// the rest).
func (s *Scheduler) retryPrefetch(r workload.Request, pf *pendingPrefetch, have int) (int, int) {
	out, known := s.cache.PrefetchOutcome(pf.id)
	known = known && pf.id != 0
	if known && out.Refused == hicache.RefusedCost {
		s.costSkip(r) // computing them is faster than reading them
		return retryNo, 0
	}
	if known && out.Refused != hicache.RefusedNone && !out.Refused.Transient() {
		s.counts.PrefetchCutPages += int64(out.Stored - out.Inserted)
		return retryNo, 0
	}
	if have > pf.pages[1] {
		return retryAsk, 0
	}
	missing := 0
	switch {
	case known:
		missing = pf.pages[1] + out.Stored - have
	case pf.recheck:
		missing = pf.pages[1] - have
	}
	switch {
	case missing <= 0:
		return retryNo, 0
	case pf.attempts >= maxPrefetchAttempts:
		by := &s.counts.PrefetchRefusedBy
		cause := &by.Lost // read (or not refused), then lost before the hold
		if known {
			switch out.Refused {
			case hicache.RefusedNoRoom:
				cause = &by.NoRoom
			case hicache.RefusedQuota:
				cause = &by.Quota
			case hicache.RefusedTreeChanged:
				cause = &by.TreeChanged
			case hicache.RefusedDuplicate:
				cause = &by.Duplicate
			}
		}
		s.refused(int64(missing), cause)
		return retryNo, 0
	case pf.epoch == s.roomEpoch && (len(s.running) > 0 || s.cache.Pending() > 0):
		return retryWait, 0
	}
	pf.attempts++
	pf.epoch = s.roomEpoch
	s.counts.PrefetchRetries++
	return retryAsk, missing
}

// refused counts n stored pages computed instead of read, under cause (a field of
// Counts.PrefetchRefusedBy).
func (s *Scheduler) refused(n int64, cause *int64) {
	s.counts.PrefetchRefusedPages += n
	*cause += n
}

// holdPrefetched settles the prefetches the last step finished, in queue order, before the
// step's decisions (a finish's insert, an earlier request's prefill) can evict what they
// read: their holds are taken (when allowed) and their read prefixes unlocked.
func (s *Scheduler) holdPrefetched() error {
	if len(s.prefetches) == 0 {
		return nil
	}
	for _, r := range s.queue {
		if pf := s.prefetches[r.ID]; pf != nil && math.IsNaN(pf.readyNs) {
			if _, err := s.prefetchWaits(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// admitted forgets r's prefetch once r's prefill locked its own match: the hold goes.
func (s *Scheduler) admitted(r workload.Request) error {
	pf := s.prefetches[r.ID]
	if pf == nil {
		return nil
	}
	delete(s.prefetches, r.ID)
	s.prefetchHeld -= pf.weight
	s.roomEpoch++
	if pf.locked == 0 {
		return nil
	}
	return s.cache.Unlock(pf.locked)
}

// holdsAllowed says whether a waiting request may hold its match: not in a step in which an
// insert or a load-back found L1 full, nor in the step after. A hold pins the L1 pages of
// its match, which no admission accounts for (fits counts the pages of running requests),
// so the holds of the requests behind the first in the queue can fill L1, and the first
// one's prefill, or a running request's finish, find no room. Releasing the holds is not
// enough if the requests behind take them again in the same step: the call that wanted
// room then meets them again at every retry, and every rank steps forever with nothing to
// do (the store stopped while a replica's second turns all waited for it: the runner's
// TestStoreStopsWhilePrefetchesWait). So that call is tried again at the next step with no
// hold in its way, and holds are taken again after a step in which nothing wanted room.
// Nor while admissions are held for a flush when idle, which a hold would keep from
// coming. Replicated.
func (s *Scheduler) holdsAllowed() bool {
	return !s.roomWanted && !s.roomWantedLast && !s.holdsAdmissions(uint64(s.counts.Steps))
}

// wantRoom records that an insert or a load-back found L1 full, and releases the holds of
// the waiting requests (releaseHolds).
func (s *Scheduler) wantRoom() error {
	s.roomWanted = true
	return s.releaseHolds()
}

// releaseHolds unlocks the matches the waiting requests hold: each is matched again before
// its prefill (recheck), and what it lost meanwhile is fetched again. Replicated.
func (s *Scheduler) releaseHolds() error {
	for _, id := range slices.Sorted(maps.Keys(s.prefetches)) {
		pf := s.prefetches[id]
		if math.IsNaN(pf.readyNs) || pf.locked == 0 {
			continue // reading (its lock is the prefix the read is for), or holding nothing
		}
		if err := s.cache.Unlock(pf.locked); err != nil {
			return err
		}
		pf.locked, pf.recheck = 0, true
	}
	return nil
}

// askPrefetch matches r and, when its prompt continues beyond the tree's L1 and L2 pages,
// locks the matched prefix (the continuation is read for it, and an evicted prefix would
// make the group discard what it read) and asks storage for the rest. It extends
// pf.pages to the pages the tree holds now and reports whether a prefetch started.
func (s *Scheduler) askPrefetch(r workload.Request, pf *pendingPrefetch) (bool, error) {
	c := s.cache
	delete(s.costSkipped, r.ID)
	m, err := c.Match(cacheRequest(r))
	if err != nil {
		return false, err
	}
	have := m.DevicePages + m.HostPages
	if pf.pages[0] < 0 {
		pf.pages = [2]int{have, have}
	}
	pf.pages[1] = max(pf.pages[1], have)
	if have*s.cfg.PageSize >= len(r.Tokens) {
		return false, nil
	}
	if err := c.Lock(m.Last); err != nil {
		return false, err
	}
	res, err := c.Prefetch(cacheRequest(r))
	if res.CostSkipped {
		s.costSkip(r)
	}
	if err != nil || res.ID == 0 {
		return false, errors.Join(err, c.Unlock(m.Last))
	}
	pf.id, pf.locked = res.ID, m.Last
	return true, nil
}

// waitIdle moves the clock to the next event when nothing can happen before it: nothing
// runs, and no queued request has arrived or has its prefetch read (in virtual time).
func (s *Scheduler) waitIdle() {
	if len(s.running) > 0 || len(s.queue) == 0 {
		return
	}
	next := math.Inf(1)
	first := s.blocked // admit's scratch, free until admit clears it: clients seen in the queue
	clear(first)
	for _, r := range s.queue {
		if r.Client >= 0 {
			if first[r.Client] {
				continue // a later turn waits for its conversation's earlier one (see admit)
			}
			first[r.Client] = true
		}
		if pf := s.prefetches[r.ID]; pf != nil {
			if math.IsNaN(pf.readyNs) {
				return // the cache is still reading: step until it is done
			}
			next = min(next, pf.readyNs)
			continue
		}
		if s.deferred[r.ID] {
			continue // its prefetch waits for those before it (see prefetchWaits)
		}
		next = min(next, s.clock.Arrival(r))
		break // the queue is in arrival order
	}
	if !math.IsInf(next, 1) {
		s.clock.AdvanceTo(next)
	}
}

// backedUp charges the L1→L2 backup of pages just inserted: write-through policies back
// every inserted page up at once; write_back backs up at eviction, which the model does not
// charge (it overlaps compute like any backup).
func (s *Scheduler) backedUp(pages int) {
	if s.cfg.Policy != hicache.WriteBack {
		s.clock.BackedUp(pages)
	}
}
