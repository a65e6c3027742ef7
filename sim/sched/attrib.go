package sched

import (
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
)

// MissTracker attributes misses from what the scheduler did: a shadow of which pages (by
// chained prefix hash) were ever inserted, which had an L2 copy, and which are answers of
// running requests not inserted yet. It only observes (an Observer); it decides nothing, so
// only a replica's leader keeps one.
type MissTracker struct {
	pageSize   int
	policy     hicache.Policy
	storage    bool
	seen       map[hicache.PageID]struct{} // pages inserted since the cache started or was last flushed
	flushed    map[hicache.PageID]struct{} // pages dropped by the flush that ended a quarantine
	quarantine bool                        // the group was in quarantine at the last prefill
	inL2       map[hicache.PageID]struct{} // pages seen in L2 (write_through_selective only; see hadL2)
	inflight   map[hicache.PageID]int      // answer pages of running requests (count of requests)
	running    map[int][]hicache.PageID    // the answer pages counted in inflight, by request ID
	// answer is a request's answer (nil: workload.Answer). With an Engine it is what the
	// engine generated: at the prefill only the first token, at the finish the whole answer.
	answer func(workload.Request) []int32
	causes report.MissCauses
}

// NewMissTracker returns the miss attribution of a scheduler of cfg.
func NewMissTracker(cfg Config) *MissTracker {
	return &MissTracker{pageSize: cfg.PageSize, policy: cfg.Policy, storage: cfg.Storage,
		seen: map[hicache.PageID]struct{}{}, flushed: map[hicache.PageID]struct{}{}, inL2: map[hicache.PageID]struct{}{}, inflight: map[hicache.PageID]int{}, running: map[int][]hicache.PageID{}}
}

// hadL2 says whether a page that was inserted had an L2 copy when it was dropped. Under
// write_through every inserted page is backed up, under write_back every page leaving L1
// is; under write_through_selective only hot pages are, and the tracker knows those that a
// match found in L2.
func (t *MissTracker) hadL2(h hicache.PageID) bool {
	if t.policy != hicache.WriteThroughSelective {
		return true
	}
	_, ok := t.inL2[h]
	return ok
}

// quarantined records whether the group is in quarantine now; the end of a quarantine is
// an agreed flush that dropped every page.
func (t *MissTracker) quarantined(q bool) {
	if t.quarantine && !q {
		for h := range t.seen {
			t.flushed[h] = struct{}{}
		}
		clear(t.seen)
	}
	t.quarantine = q
}

// prefilled attributes the misses of r's prefill: the first matched pages were found in the
// cache (device or host) by its match, served pages were served (hits), and the rest of the
// prompt was computed (all of it beyond the served pages for cost, when cost says the cost
// rule skipped its continuation).
func (t *MissTracker) prefilled(r workload.Request, matched, served int, cost bool) {
	P := t.pageSize
	hashes := hicache.KeyPrefixHashes(r.Key, r.Tokens[:len(r.Tokens)/P*P], P)
	t.causes.PartialPage += int64(len(r.Tokens) % P)
	for i := served; i < len(hashes); i++ {
		h := hashes[i]
		_, seen := t.seen[h]
		_, flushed := t.flushed[h]
		switch {
		case cost:
			t.causes.Cost += int64(P)
		case t.inflight[h] > 0:
			t.causes.InFlight += int64(P)
		case !seen && !flushed:
			t.causes.Compulsory += int64(P)
		case t.quarantine || !seen:
			t.causes.Quarantined += int64(P)
		case i < matched:
			t.causes.CapacityL1 += int64(P) // in the cache, but L1 could not take it back
		case !t.hadL2(h):
			t.causes.CapacityL1 += int64(P)
		case t.storage:
			t.causes.Storage += int64(P)
		default:
			t.causes.CapacityL2 += int64(P)
		}
	}
	for _, h := range hashes {
		t.seen[h] = struct{}{}
	}
	pages := t.answerPages(r)
	for _, h := range pages {
		t.inflight[h]++
	}
	t.running[r.ID] = pages
}

// matchedL2 records the pages a match found in L2 only.
func (t *MissTracker) matchedL2(r workload.Request, m hicache.MatchResult) {
	if t.policy != hicache.WriteThroughSelective || m.HostPages == 0 {
		return
	}
	n := (m.DevicePages + m.HostPages) * t.pageSize
	for _, h := range hicache.KeyPrefixHashes(r.Key, r.Tokens[:n], t.pageSize)[m.DevicePages:] {
		t.inL2[h] = struct{}{}
	}
}

// answerPages are the pages of r's prompt and answer that its prompt alone does not hold.
func (t *MissTracker) answerPages(r workload.Request) []hicache.PageID {
	P := t.pageSize
	answer := workload.Answer
	if t.answer != nil {
		answer = t.answer
	}
	full := append(r.Tokens[:len(r.Tokens):len(r.Tokens)], answer(r)...)
	return hicache.KeyPrefixHashes(r.Key, full[:len(full)/P*P], P)[len(r.Tokens)/P:]
}

// finished records that r's prompt and answer were inserted.
func (t *MissTracker) finished(r workload.Request) {
	for _, h := range t.running[r.ID] {
		if t.inflight[h]--; t.inflight[h] <= 0 {
			delete(t.inflight, h)
		}
	}
	delete(t.running, r.ID)
	for _, h := range t.answerPages(r) {
		t.seen[h] = struct{}{}
	}
}

// Causes are the misses attributed so far.
func (t *MissTracker) Causes() report.MissCauses { return t.causes }

// Matched implements Observer: it records the pages the match found in L2 only.
func (t *MissTracker) Matched(r workload.Request, m hicache.MatchResult) { t.matchedL2(r, m) }

// Prefilled implements Observer: it attributes the prefill's misses.
func (t *MissTracker) Prefilled(p Prefill) {
	if p.Diverged {
		t.quarantined(p.Quarantined)
	}
	t.prefilled(p.Request, p.Matched, p.Served, p.CostSkipped)
}

// Finished implements Observer.
func (t *MissTracker) Finished(r workload.Request) { t.finished(r) }

// Stepped implements Observer.
func (t *MissTracker) Stepped(int64) {}

// BadPage implements Observer.
func (t *MissTracker) BadPage() {}
