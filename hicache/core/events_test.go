package core

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// evModel is what a subscriber rebuilds from the events: the pages of each tier.
type evModel struct {
	tiers  [3]map[PageID]bool
	events int
}

func newEvModel() *evModel {
	m := &evModel{}
	for i := range m.tiers {
		m.tiers[i] = map[PageID]bool{}
	}
	return m
}

// apply applies events as a router would, failing on one that cannot be right: a removal of
// a page not held, a stored run whose tokens or parent do not match its hashes.
func (m *evModel) apply(events []Event, pageSize int) error {
	for _, e := range events {
		m.events++
		switch e.Kind {
		case EventCleared:
			for i := range m.tiers {
				clear(m.tiers[i])
			}
		case EventStored:
			if len(e.Tokens) != len(e.Hashes)*pageSize {
				return fmt.Errorf("stored %s run of %d hashes with %d tokens", e.Tier, len(e.Hashes), len(e.Tokens))
			}
			h := KeyRoot(e.Key)
			if e.HasParent {
				h = e.Parent
			}
			for i, want := range e.Hashes {
				if h = PageHash(h, e.Tokens[i*pageSize:(i+1)*pageSize]); h != want {
					return fmt.Errorf("stored %s run: page %d hash %#x, its tokens and parent give %#x", e.Tier, i, want, h)
				}
				m.tiers[e.Tier][want] = true
			}
		case EventRemoved:
			for _, h := range e.Hashes {
				if !m.tiers[e.Tier][h] {
					return fmt.Errorf("removed %s page %#x, which was not stored", e.Tier, h)
				}
				delete(m.tiers[e.Tier], h)
			}
		}
	}
	return nil
}

func samePages(a, b map[PageID]bool) bool {
	return len(a) == len(b) && !slices.ContainsFunc(slices.Collect(maps.Keys(a)), func(h PageID) bool { return !b[h] })
}

// checkEvents applies rank 0's events since the last step to the sim's model and compares
// it with rank 0's tree: the device and host pages are exactly the tree's, and every page
// announced in storage is held by every shard's store.
func (s *replicaSim) checkEvents() {
	s.t.Helper()
	c := s.cores[0]
	if err := s.ev.apply(c.TakeEvents(nil), s.cfg.PageSize); err != nil {
		s.fatalf("events: %v", err)
	}
	l1, l2 := c.TreePagesForTest()
	if !samePages(s.ev.tiers[TierDevice], l1) {
		s.fatalf("events say %d device pages, the tree holds %d in L1", len(s.ev.tiers[TierDevice]), len(l1))
	}
	if !samePages(s.ev.tiers[TierHost], l2) {
		s.fatalf("events say %d host pages, the tree holds %d in L2", len(s.ev.tiers[TierHost]), len(l2))
	}
	for h := range s.ev.tiers[TierStorage] {
		for g := range s.store {
			if s.store[g][h] == nil {
				s.fatalf("events say page %#x is in storage; shard %d does not hold it", h, g)
			}
		}
	}
	if len(s.ev.tiers[TierStorage]) > 0 {
		s.counts["events-storage"]++
	}
}

// TestEventsFollowTheTree: under the random workload of TestReplicasRandomOps (evictions,
// load-backs, prefetches, failures, flushes, divergences and recoveries), the pages a
// subscriber rebuilds from rank 0's events equal the tree's L1 and L2 pages after every step.
// Rank 0 alone has events on: the digests the sim checks show they change no replicated
// state.
func TestEventsFollowTheTree(t *testing.T) {
	total := map[string]int{}
	seeds := 120
	if testing.Short() {
		seeds = 30
	}
	for seed := range uint64(seeds) {
		for k, v := range runReplicaSim(t, 1000+seed, 150) {
			total[k] += v
		}
	}
	t.Logf("%v", total)
	for _, k := range []string{"events-storage", "flush", "recovered"} {
		if total[k] == 0 {
			t.Errorf("the workload never exercised %s: %v", k, total)
		}
	}
}

// TestEnableEventsAnnouncesWhatIsHeld: events turned on late report every page already held.
func TestEnableEventsAnnouncesWhatIsHeld(t *testing.T) {
	c := newTestCore(t, Options{PageSize: 4, L1Pages: 16})
	if _, err := c.Insert(Request{Tokens: goldenTokens, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if got := c.TakeEvents(nil); got != nil {
		t.Fatalf("events while off: %+v", got)
	}
	c.EnableEvents(true)
	ev := c.TakeEvents(nil)
	want := KeyPrefixHashes("k", goldenTokens, 4)
	if len(ev) != 1 || ev[0].Kind != EventStored || ev[0].Tier != TierDevice || !slices.Equal(ev[0].Hashes, want) || ev[0].Key != "k" || ev[0].HasParent {
		t.Fatalf("events %+v, want one stored device run of %#x under key k", ev, want)
	}
	if ev := c.TakeEvents(nil); len(ev) != 0 {
		t.Fatalf("a second TakeEvents gave %+v", ev)
	}
}
