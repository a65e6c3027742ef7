package report

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

// Add adds the causes of o to m.
func (m *MissCauses) Add(o MissCauses) {
	m.Compulsory += o.Compulsory
	m.CapacityL1 += o.CapacityL1
	m.CapacityL2 += o.CapacityL2
	m.InFlight += o.InFlight
	m.Quarantined += o.Quarantined
	m.Storage += o.Storage
	m.Cost += o.Cost
	m.PartialPage += o.PartialPage
}
