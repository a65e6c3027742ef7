package core

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/slab/alloc"
)

// Prefetch from storage into L2: query, agreed reserve, read, agreed insert (l3core.go has
// the queues and the vector slots).

// PrefetchResult says what a Prefetch started.
type PrefetchResult struct {
	// ID names the prefetch for PrefetchPending and RevokePrefetch; 0 when nothing started.
	ID uint64
	// Start is the first sequence page asked for (the pages before it are in the tree);
	// Pages is how many pages storage is asked about (each rank for the ones it owns).
	Start, Pages int
	// CostSkipped: nothing started because reading the continuation's Pages pages, even
	// all stored and at the full bandwidth of every I/O rank, is slower than computing them
	// (L3Config.Cost): the caller computes them without waiting for an answer.
	CostSkipped bool
}

// PrefetchRefusal says why stored pages of a prefetch were not inserted into L2.
type PrefetchRefusal int

// Prefetch refusals.
const (
	// RefusedNone: every stored page asked for was inserted (or nothing was stored).
	RefusedNone PrefetchRefusal = iota
	// RefusedQuota: other prefetches held PrefetchQuotaPages reserved L2 pages; what was
	// read was clamped to what the quota left.
	RefusedQuota
	// RefusedNoRoom: L2 had no room for the read, even after evicting every evictable page.
	RefusedNoRoom
	// RefusedTreeChanged: the prefix left the tree, or its continuation entered it, before
	// the read started or ended.
	RefusedTreeChanged
	// RefusedDuplicate: another prefetch was reading the same continuation.
	RefusedDuplicate
	// RefusedRevoked: the scheduler revoked the prefetch before its read was over.
	RefusedRevoked
	// RefusedCut: the read was cut by a rank's PrefetchTimeout timer.
	RefusedCut
	// RefusedShort: the read ended with fewer pages than were stored (a storage error, or a
	// page rejected, on the rank that owns it).
	RefusedShort
	// RefusedBelowMin: fewer pages were stored, or left by the quota, than MinPrefetchPages.
	RefusedBelowMin
	// RefusedCost: reading the stored pages is slower than computing them (L3Config.Cost).
	RefusedCost
)

func (r PrefetchRefusal) String() string {
	names := [...]string{"none", "quota", "no L2 room", "tree changed", "duplicate", "revoked", "cut", "short read", "below minimum", "slower than compute"}
	if r >= 0 && int(r) < len(names) {
		return names[r]
	}
	return fmt.Sprintf("PrefetchRefusal(%d)", int(r))
}

// Transient reports whether a retry of the prefetch may insert what this refusal left out:
// the quota and the L2 room free up as other prefetches end and their requests run, and a
// changed tree or a duplicate read may hold or lack the pages by then.
func (r PrefetchRefusal) Transient() bool {
	switch r {
	case RefusedQuota, RefusedNoRoom, RefusedTreeChanged, RefusedDuplicate:
		return true
	}
	return false
}

// PrefetchOutcome is how a finished prefetch ended (Core.PrefetchOutcome).
type PrefetchOutcome struct {
	// Stored is how many leading pages of the continuation every rank found stored (each
	// checks its own pages).
	Stored int
	// Inserted is how many of them became an L2-only node (Inserted <= Stored).
	Inserted int
	// Refused says why the Stored-Inserted others were not inserted (RefusedNone when
	// Inserted == Stored).
	Refused PrefetchRefusal
}

// maxOutcomes bounds the finished prefetches whose outcome the core remembers.
const maxOutcomes = 4096

// recordOutcome remembers how prefetch id ended, forgetting the oldest beyond maxOutcomes.
func (c *Core) recordOutcome(id uint64, o PrefetchOutcome) {
	if o.Inserted >= o.Stored {
		o.Refused = RefusedNone
	}
	l := &c.l3
	if l.outcomes == nil {
		l.outcomes = map[uint64]PrefetchOutcome{}
	}
	if _, ok := l.outcomes[id]; !ok {
		l.outcomeIDs = append(l.outcomeIDs, id)
	}
	l.outcomes[id] = o
	if len(l.outcomeIDs) > maxOutcomes {
		delete(l.outcomes, l.outcomeIDs[0])
		l.outcomeIDs = l.outcomeIDs[1:]
	}
}

// PrefetchOutcome returns how prefetch id ended: false while it is pending, after a flush or
// a divergence, or once maxOutcomes later prefetches ended. Replicated.
func (c *Core) PrefetchOutcome(id uint64) (PrefetchOutcome, bool) {
	o, ok := c.l3.outcomes[id]
	return o, ok
}

// Prefetch asks storage for the continuation of r's tokens beyond what the tree holds: every
// rank queries its own pages in the background; once the group agreed how many leading
// pages are stored (the longest prefix every rank holds, at least MinPrefetchPages), it
// reserves L2 pages for them and every rank reads its own into its slab; when the policy
// says the read is over, every rank inserts the agreed number of pages (the longest prefix
// every rank verified) as an L2-only node, which a later Match reports
// as host pages. Nothing starts without L3, in quarantine, while the storage circuit is
// open, or when the continuation is shorter than MinPrefetchPages, and (without
// MeasuredReads) when the cost rule says no prefix of it can pay off (CostSkipped). The
// query is under r's isolation key: it asks storage for the key's pages (the key seeds
// their hashes, which are the L3 keys) and inserts them under the key. Replicated.
func (c *Core) Prefetch(r Request) PrefetchResult {
	key, tokens := r.Key, r.Tokens
	if !c.cfg.L3 || c.quarantined || c.l3.circuitOpen {
		return PrefetchResult{}
	}
	o := &c.cfg.L3Config
	P := c.cfg.PageSize
	have, h, k := c.continuation(key, tokens)
	prev := h
	if k < o.MinPrefetchPages || k <= 0 {
		return PrefetchResult{}
	}
	if c.costSkips(have, k) {
		return PrefetchResult{Start: have, Pages: k, CostSkipped: true}
	}
	hashes := make([]PageID, k)
	for i := range hashes {
		h = c.hs.page(h, tokens[(have+i)*P:(have+i+1)*P])
		hashes[i] = h
	}
	q := &queryOp{seq: c.l3.querySeq, key: key, tokens: slices.Clone(tokens[:(have+k)*P]), start: have, prev: prev, hashes: hashes}
	c.l3.querySeq++
	c.l3.queries = append(c.l3.queries, q)
	if own, _ := c.ownShare(have, hashes, nil); len(own) > 0 {
		c.l3.jobs = append(c.l3.jobs, StorageJob{Kind: StorageQuery, Seq: q.seq, Hashes: own})
	} else {
		q.answered = true // none of the pages is this rank's: it vouches for all
	}
	c.stats.L3Queries++
	return PrefetchResult{ID: q.seq + 1, Start: have, Pages: k}
}

// continuation walks tokens under isolation key key and returns the pages the tree holds, the hash of the last of
// them and how many pages a prefetch would ask about (the rest of the whole pages, at most
// the quota).
func (c *Core) continuation(key string, tokens []int32) (have int, h PageID, k int) {
	h = c.hs.root(key)
	var buf [walkBuf]pathMatch
	for _, m := range c.walk(buf[:0], key, tokens) {
		have += m.pages
		h = m.n.hashes[m.pages-1]
	}
	return have, h, min(len(tokens)/c.cfg.PageSize-have, c.cfg.L3Config.PrefetchQuotaPages)
}

// costSkips reports whether the cost rule (without MeasuredReads) finds that no leading part
// of k pages from sequence page have can pay off (PrefetchCost.MayPay).
func (c *Core) costSkips(have, k int) bool {
	pc := &c.cfg.L3Config.Cost
	return !pc.MeasuredReads && !pc.MayPay(have, k, c.cfg.PageSize, pc.StorageBytesPerNs)
}

// PrefetchSkipsForCost reports whether Prefetch(r) would start nothing because of the
// cost rule (PrefetchResult.CostSkipped), without starting anything. Replicated.
func (c *Core) PrefetchSkipsForCost(r Request) bool {
	if !c.cfg.L3 || c.quarantined || c.l3.circuitOpen {
		return false
	}
	have, _, k := c.continuation(r.Key, r.Tokens)
	return k >= c.cfg.L3Config.MinPrefetchPages && k > 0 && c.costSkips(have, k)
}

// PrefetchPending reports whether prefetch id is still being queried or read. Replicated.
func (c *Core) PrefetchPending(id uint64) bool {
	for _, q := range c.l3.queries {
		if q.seq+1 == id {
			return true
		}
	}
	for _, r := range c.l3.reads {
		if r.id == id {
			return true
		}
	}
	return false
}

// RevokePrefetch tells the group that the scheduler no longer waits for prefetch id: a
// query not yet answered reserves nothing; a read stops at the next step (except under
// PrefetchWaitComplete) and the prefix every rank completed is inserted. Unknown or finished
// ids are ignored. Replicated.
func (c *Core) RevokePrefetch(id uint64) {
	for _, q := range c.l3.queries {
		if q.seq+1 == id {
			q.revoked = true
		}
	}
	for _, r := range c.l3.reads {
		if r.id == id {
			r.revoked = true
		}
	}
}

// prefixEnd walks the first start pages of tokens under key and returns the node holding the last of
// them (nil when the tree no longer holds exactly that prefix) and how many of that node's
// pages belong to the prefix.
func (c *Core) prefixEnd(key string, tokens []int32, start int) (*treeNode, int, bool) {
	var buf [walkBuf]pathMatch
	path := c.walk(buf[:0], key, tokens[:start*c.cfg.PageSize])
	have := 0
	for _, m := range path {
		have += m.pages
	}
	if have != start {
		return nil, 0, false
	}
	if len(path) == 0 {
		return c.root, 0, true
	}
	last := path[len(path)-1]
	return last.n, last.pages, true
}

// startRead applies an agreed query answer: hits leading pages are stored. Below the
// threshold, for a revoked query, when the tree changed, or when L2 has no room, nothing
// is read.
func (c *Core) startRead(q *queryOp, hits int) {
	o := &c.cfg.L3Config
	if hits <= 0 {
		c.recordOutcome(q.seq+1, PrefetchOutcome{})
		return
	}
	c.stats.L3HitPages += int64(hits)
	stored := hits
	skip := func(why PrefetchRefusal) {
		c.stats.L3SkippedPrefetches++
		c.recordOutcome(q.seq+1, PrefetchOutcome{Stored: stored, Refused: why})
	}
	clamp := RefusedNone
	if left := o.PrefetchQuotaPages - c.l3.reserved; hits > left {
		hits, clamp = left, RefusedQuota
	}
	switch {
	case q.revoked:
		skip(RefusedRevoked)
		return
	case hits <= 0 && clamp == RefusedQuota:
		skip(RefusedQuota)
		return
	case hits < o.MinPrefetchPages || hits <= 0:
		skip(max(clamp, RefusedBelowMin))
		return
	case !c.prefetchPays(q.start, hits):
		c.stats.L3CostSkippedPages += int64(hits)
		skip(RefusedCost)
		return
	}
	end, _, ok := c.prefixEnd(q.key, q.tokens, q.start)
	if !ok || c.indexGet(q.hashes[0]) != nil {
		skip(RefusedTreeChanged) // the tree changed since the query
		return
	}
	for _, r := range c.l3.reads {
		if r.hashes[0] == q.hashes[0] {
			skip(RefusedDuplicate) // the same continuation is being read
			return
		}
	}
	rid := alloc.RangeID(c.nextID)
	c.nextID++
	pages, err := c.alloc.Reserve(rid, q.start, hits)
	if errors.Is(err, alloc.ErrNoSpace) {
		c.lockPath(end, 1)
		c.evictL2(1<<62, func() bool { return c.alloc.Fits(q.start, hits) })
		c.lockPath(end, -1)
		c.dropL2Copies(q.start, hits)
		pages, err = c.alloc.Reserve(rid, q.start, hits)
	}
	if err != nil {
		if !errors.Is(err, alloc.ErrNoSpace) && !errors.Is(err, alloc.ErrTooLarge) {
			panic(fmt.Sprintf("core: reserve for prefetch %d: %v (replica invariant broken)", q.seq+1, err))
		}
		skip(RefusedNoRoom)
		return
	}
	r := &readOp{seq: c.l3.readSeq, id: q.seq + 1, rid: rid, key: q.key, tokens: q.tokens[:(q.start+hits)*c.cfg.PageSize],
		start: q.start, prev: q.prev, hashes: q.hashes[:hits], pages: pages, revoked: q.revoked, stored: stored, clamp: clamp}
	c.l3.readSeq++
	c.l3.reads = append(c.l3.reads, r)
	c.l3.reserved += hits
	if hs, ps := c.ownShare(r.start, r.hashes, pages); len(ps) > 0 {
		P := c.cfg.PageSize
		var binds []Binding
		for j := c.firstOwned(r.start); j < len(r.hashes); j += c.cfg.Slabs {
			prev := r.prev
			if j > 0 {
				prev = r.hashes[j-1]
			}
			binds = append(binds, c.hs.binding(prev, r.tokens[(r.start+j)*P:(r.start+j+1)*P]))
		}
		c.l3.jobs = append(c.l3.jobs, StorageJob{Kind: StorageRead, Seq: r.seq, Hashes: hs, Binds: binds, Pages: ps})
	} else {
		r.done = true // none of the pages is this rank's: it vouches for all
	}
}

// prefetchPays applies the cost rule (L3Config.Cost) to a read of pages stored pages from
// sequence page start, at the agreed measured read bandwidth when there is one. With
// MeasuredReads, every probeEvery-th skip is read anyway (counted in L3CostProbes).
// Replicated: its inputs are the configuration and agreed values.
func (c *Core) prefetchPays(start, pages int) bool {
	pc := &c.cfg.L3Config.Cost
	bw := pc.StorageBytesPerNs
	if pc.MeasuredReads && c.l3.readRate > 0 {
		bw = float64(c.l3.readRate) / 1e9
	}
	if pc.Pays(start, pages, c.cfg.PageSize, bw) {
		return true
	}
	if pc.MeasuredReads {
		c.l3.costSkips++
		if c.l3.costSkips%probeEvery == 0 {
			c.stats.L3CostProbes++
			return true
		}
	}
	return false
}

// finishRead applies an agreed end of a read: its first m pages (each verified by its
// owner) become an L2-only node under the prefix, if the prefix is still in the tree; the
// rest of the range is released now when every rank's read stopped (stopped), else
// queued until they acknowledge. cut is why a read that did not stop was ended (the
// outcome's refusal when it inserted fewer pages than were stored).
func (c *Core) finishRead(r *readOp, m int, stopped bool, cut PrefetchRefusal) {
	k := len(r.pages)
	restPages := k // the rest stays in r.rid (a split gives the first m pages the new id)
	out := PrefetchOutcome{Stored: r.stored, Refused: cut}
	switch {
	case stopped && m < k:
		out.Refused = RefusedShort
	case stopped:
		out.Refused = r.clamp
	}
	defer func() { c.recordOutcome(r.id, out) }()
	if m > 0 {
		id := uint64(r.rid)
		if m < k {
			id = c.nextID
			c.nextID++
		}
		if n := c.attachPrefetch(r, m, id); n != nil {
			if m < k {
				if err := c.alloc.Split(r.rid, m, alloc.RangeID(id)); err != nil {
					panic(fmt.Sprintf("core: split of prefetch range %d: %v (replica invariant broken)", r.rid, err))
				}
			}
			if err := c.alloc.Commit(alloc.RangeID(id)); err != nil {
				panic(fmt.Sprintf("core: commit of prefetch range %d: %v (replica invariant broken)", id, err))
			}
			n.l2 = slices.Clone(r.pages[:m])
			n.stored = true
			// n and the L2-only nodes above it go to the back of the L2 list, deepest
			// first: every node stays behind its descendants, so that one eviction pass
			// frees the new leaf and then its parents.
			for x := n; !x.isRoot() && x.l1 == nil; x = x.parent {
				c.relist(x, true)
			}
			c.stats.L3PrefetchedPages += int64(m)
			c.l3.reserved -= m
			restPages = k - m
			out.Inserted = m
		} else {
			out.Refused = RefusedTreeChanged
		}
	}
	c.stats.L3DiscardedPages += int64(restPages)
	if restPages == 0 {
		return
	}
	if stopped {
		c.abortRange(r.rid)
		c.l3.reserved -= restPages
		return
	}
	c.l3.releases = append(c.l3.releases, &releaseOp{seq: c.l3.releaseSeq, rid: r.rid, pages: restPages, readSeq: r.seq, acked: r.done})
	c.l3.releaseSeq++
	if !r.done {
		c.l3.stops = append(c.l3.stops, r.seq)
	}
}

// attachPrefetch inserts the first m pages of a read as a new L2-only node (id) under its
// prefix, splitting the prefix's last node when the prefix ends inside it. It returns nil,
// changing nothing but a split, when the tree no longer holds exactly the prefix or
// already holds the first page.
func (c *Core) attachPrefetch(r *readOp, m int, id uint64) *treeNode {
	end, used, ok := c.prefixEnd(r.key, r.tokens, r.start)
	if !ok || c.indexGet(r.hashes[0]) != nil {
		return nil
	}
	if !end.isRoot() && used < len(end.hashes) {
		end = c.split(end, used)
	}
	P := c.cfg.PageSize
	toks := slices.Clone(r.tokens[r.start*P : (r.start+m)*P])
	return c.newNodeID(end, r.key, toks, slices.Clone(r.hashes[:m]), id)
}
