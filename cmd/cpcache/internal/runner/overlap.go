package runner

import (
	"errors"
	"math"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/workload"
)

// pendingPrefetch is a queued request's prefetch from storage. The request waits in the
// queue, and everything else keeps running, until the cache inserted what the prefetch
// read and the virtual clock passed the modelled read time (as in SGLang's HiCache, where
// a request whose prefetch is under way is not scheduled yet).
type pendingPrefetch struct {
	id      uint64        // the cache's prefetch under way
	locked  *hicache.Node // the prefix node locked while the cache reads
	askedNs float64       // virtual time the first prefetch was asked
	readyNs float64       // NaN until the cache finished
	pages   [2]int        // page range [from, to) of the prompt the prefetches added
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
		pf = &pendingPrefetch{askedNs: s.clock.nowNs, readyNs: math.NaN(), pages: [2]int{-1, -1}}
		started, err := s.askPrefetch(r, pf)
		if err != nil || !started {
			return false, err
		}
		s.prefetches[r.ID] = pf
	}
	if math.IsNaN(pf.readyNs) {
		if c.PrefetchPending(pf.id) {
			return true, nil
		}
		if err := c.Unlock(pf.locked); err != nil {
			return false, err
		}
		// Prefetches of a shared prefix asked together are read once: when this one
		// gained pages but the prompt goes on, ask for the rest.
		m, err := c.Match(r.Tokens)
		if err != nil {
			return false, err
		}
		if have := m.DevicePages + m.HostPages; have > pf.pages[1] && have*P < len(r.Tokens) {
			started, err := s.askPrefetch(r, pf)
			if err != nil || started {
				return started, err
			}
		} else {
			pf.pages[1] = max(pf.pages[1], have)
		}
		pf.readyNs = s.clock.storageReady(pf.askedNs, pf.pages[1]-pf.pages[0])
	}
	return s.clock.nowNs < pf.readyNs, nil
}

// askPrefetch matches r and, when its prompt continues beyond the tree's L1 and L2 pages,
// locks the matched prefix (the continuation is read for it, and an evicted prefix would
// make the group discard what it read) and asks storage for the rest. It extends
// pf.pages to the pages the tree holds now and reports whether a prefetch started.
func (s *scheduler) askPrefetch(r workload.Request, pf *pendingPrefetch) (bool, error) {
	c := s.cache
	m, err := c.Match(r.Tokens)
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
	res, err := c.Prefetch(r.Tokens)
	if err != nil || res.ID == 0 {
		return false, errors.Join(err, c.Unlock(m.Last))
	}
	pf.id, pf.locked = res.ID, m.Last
	return true, nil
}

// waitIdle moves the clock to the next event when nothing can happen before it: nothing
// runs, and no queued request has arrived or has its prefetch read (in virtual time).
func (s *scheduler) waitIdle() {
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
