package runner

import (
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/workload"
)

// MissCauses counts every missed prompt token under exactly one cause; they sum to the
// tokens missed.
type MissCauses struct {
	// Compulsory: the page was never in the cache before (first reference).
	Compulsory int64 `json:"compulsory"`
	// CapacityL1: the page was cached but not served because L1 had no room: it was dropped
	// from L1 without an L2 copy, or it was in L2 and L1 could not take it back.
	CapacityL1 int64 `json:"capacity_l1"`
	// CapacityL2: the page had an L2 copy and was evicted from L2.
	CapacityL2 int64 `json:"capacity_l2"`
	// InFlight: the page is part of a running request's answer, not inserted yet.
	InFlight int64 `json:"in_flight"`
	// Quarantined: the page was cached, but the group was in quarantine after a divergence
	// (no hits until the agreed flush), or the flush that ended it dropped the page.
	Quarantined int64 `json:"quarantined"`
	// Storage: with an L3 tier, a page evicted from L2 that the prefetch from storage did
	// not bring back (a storage error, a timeout under the prefetch policy, or a page whose
	// backup to storage had not completed).
	Storage int64 `json:"storage"`
	// Cost: with an L3 tier, a page computed because reading it from storage was slower
	// (the cache's cost rule skipped it: Report.PrefetchCostSkippedPages).
	Cost int64 `json:"cost"`
	// PartialPage: the tokens of the prompt's last, incomplete page (the cache holds whole
	// pages only).
	PartialPage int64 `json:"partial_page"`
}

// Total is the sum of the causes.
func (m MissCauses) Total() int64 {
	return m.Compulsory + m.CapacityL1 + m.CapacityL2 + m.InFlight + m.Quarantined + m.Storage + m.Cost + m.PartialPage
}

func (m *MissCauses) add(o MissCauses) {
	m.Compulsory += o.Compulsory
	m.CapacityL1 += o.CapacityL1
	m.CapacityL2 += o.CapacityL2
	m.InFlight += o.InFlight
	m.Quarantined += o.Quarantined
	m.Storage += o.Storage
	m.Cost += o.Cost
	m.PartialPage += o.PartialPage
}

// missTracker attributes misses from what the scheduler did: a shadow of which pages (by
// chained prefix hash) were ever inserted, which had an L2 copy, and which are answers of
// running requests not inserted yet. It only observes; it decides nothing, so only a
// replica's leader keeps one.
type missTracker struct {
	pageSize   int
	policy     hicache.Policy
	storage    bool
	seen       map[uint64]struct{} // pages inserted since the cache started or was last flushed
	flushed    map[uint64]struct{} // pages dropped by the flush that ended a quarantine
	quarantine bool                // the group was in quarantine at the last prefill
	inL2       map[uint64]struct{} // pages seen in L2 (write_through_selective only; see hadL2)
	inflight   map[uint64]int      // answer pages of running requests (count of requests)
	causes     MissCauses
}

func newMissTracker(cfg *Config) *missTracker {
	return &missTracker{pageSize: cfg.PageSize, policy: cfg.Policy, storage: cfg.Storage != "",
		seen: map[uint64]struct{}{}, flushed: map[uint64]struct{}{}, inL2: map[uint64]struct{}{}, inflight: map[uint64]int{}}
}

// hadL2 says whether a page that was inserted had an L2 copy when it was dropped. Under
// write_through every inserted page is backed up, under write_back every page leaving L1
// is; under write_through_selective only hot pages are, and the tracker knows those that a
// match found in L2.
func (t *missTracker) hadL2(h uint64) bool {
	if t.policy != hicache.WriteThroughSelective {
		return true
	}
	_, ok := t.inL2[h]
	return ok
}

// quarantined records whether the group is in quarantine now; the end of a quarantine is
// an agreed flush that dropped every page.
func (t *missTracker) quarantined(q bool) {
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
func (t *missTracker) prefilled(r workload.Request, matched, served int, cost bool) {
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
	for _, h := range t.answerPages(r) {
		t.inflight[h]++
	}
}

// matchedL2 records the pages a match found in L2 only.
func (t *missTracker) matchedL2(r workload.Request, m hicache.MatchResult) {
	if t.policy != hicache.WriteThroughSelective || m.HostPages == 0 {
		return
	}
	n := (m.DevicePages + m.HostPages) * t.pageSize
	for _, h := range hicache.KeyPrefixHashes(r.Key, r.Tokens[:n], t.pageSize)[m.DevicePages:] {
		t.inL2[h] = struct{}{}
	}
}

// answerPages are the pages of r's prompt and answer that its prompt alone does not hold.
func (t *missTracker) answerPages(r workload.Request) []uint64 {
	P := t.pageSize
	full := append(r.Tokens[:len(r.Tokens):len(r.Tokens)], workload.Answer(r)...)
	return hicache.KeyPrefixHashes(r.Key, full[:len(full)/P*P], P)[len(r.Tokens)/P:]
}

// finished records that r's prompt and answer were inserted.
func (t *missTracker) finished(r workload.Request) {
	for _, h := range t.answerPages(r) {
		if t.inflight[h]--; t.inflight[h] <= 0 {
			delete(t.inflight, h)
		}
		t.seen[h] = struct{}{}
	}
}
