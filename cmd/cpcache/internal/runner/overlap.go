package runner

import (
	"math"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/workload"
)

// pendingPrefetch is a queued request's prefetch from storage. The request waits in the
// queue, and everything else keeps running, until the cache inserted what the prefetch
// read and the virtual clock passed the modelled read time (as in SGLang's HiCache, where
// a request whose prefetch is under way is not scheduled yet).
type pendingPrefetch struct {
	id      uint64
	askedNs float64 // virtual time the prefetch was asked
	from    int     // pages of the prompt in the tree when it was asked
	readyNs float64 // NaN until the cache finished it
	pages   [2]int  // page range [from, to) of the prompt it added
}

// overlapPrefetch says whether prefetches overlap decoding (else the scheduler waits for
// them in steps where nothing decodes).
func (s *scheduler) overlapPrefetch() bool {
	return s.cfg.Storage != "" && !s.cfg.Time.PrefetchSync
}

// prefetchWaits starts r's prefetch when its prompt continues beyond its L1 and L2 hit, and
// reports whether r must keep waiting for it. Replicated: every branch follows from the
// cache's replicated answers and the replicated clock.
func (s *scheduler) prefetchWaits(r workload.Request) (bool, error) {
	c, P := s.cache, s.cfg.PageSize
	pf := s.prefetches[r.ID]
	if pf == nil {
		m, err := c.Match(r.Tokens)
		if err != nil {
			return false, err
		}
		if (m.DevicePages+m.HostPages)*P >= len(r.Tokens) {
			return false, nil
		}
		res, err := c.Prefetch(r.Tokens)
		if err != nil || res.ID == 0 {
			return false, err
		}
		pf = &pendingPrefetch{id: res.ID, askedNs: s.clock.nowNs, from: m.DevicePages + m.HostPages, readyNs: math.NaN()}
		s.prefetches[r.ID] = pf
	}
	if math.IsNaN(pf.readyNs) {
		if c.PrefetchPending(pf.id) {
			return true, nil
		}
		after, err := c.Match(r.Tokens)
		if err != nil {
			return false, err
		}
		to := max(after.DevicePages+after.HostPages, pf.from)
		pf.pages = [2]int{pf.from, to}
		pf.readyNs = s.clock.storageReady(pf.askedNs, to-pf.from)
	}
	return s.clock.nowNs < pf.readyNs, nil
}

// waitIdle moves the clock to the next event when nothing can happen before it: nothing
// runs, and no queued request has arrived or has its prefetch read (in virtual time).
func (s *scheduler) waitIdle() {
	if len(s.running) > 0 || len(s.queue) == 0 {
		return
	}
	next := math.Inf(1)
	for _, r := range s.queue {
		if pf := s.prefetches[r.ID]; pf != nil {
			if math.IsNaN(pf.readyNs) {
				return // the cache is still reading: step until it is done
			}
			next = min(next, pf.readyNs)
			continue
		}
		next = min(next, s.clock.arrival(r))
		break // the queue is in arrival order
	}
	if !math.IsInf(next, 1) {
		s.clock.advanceTo(next)
	}
}

// backedUp charges the L1→L2 backup of pages just inserted: write-through policies back
// every inserted page up at once; write_back backs up at eviction, which the model does not
// charge (it overlaps compute like any backup).
func (s *scheduler) backedUp(pages int) {
	if s.cfg.Policy != hicache.WriteBack {
		s.clock.backupPages += pages
	}
}
