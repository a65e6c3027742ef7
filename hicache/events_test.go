package hicache

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
)

// eventSet is the pages per tier a subscriber rebuilds from batches.
type eventSet [3]map[PageID]bool

func newEventSet() eventSet { return eventSet{{}, {}, {}} }

func (s eventSet) apply(t *testing.T, b EventBatch) {
	t.Helper()
	for _, e := range b.Events {
		switch e.Kind {
		case EventCleared:
			for i := range s {
				clear(s[i])
			}
		case EventStored:
			for _, h := range e.Hashes {
				s[e.Tier][h] = true
			}
		case EventRemoved:
			for _, h := range e.Hashes {
				if !s[e.Tier][h] {
					t.Fatalf("batch %d removes %s page %#x, not stored", b.Seq, e.Tier, h)
				}
				delete(s[e.Tier], h)
			}
		}
	}
}

// TestEventsOrderGapsAndReplay (CP4, L3): only the replica group's rank 0 publishes; batches
// come numbered without gaps in step order; a subscriber that never reads loses batches
// (Steps never wait for it) and sees the gap in Seq; EventsSince and Subscribe(from) replay
// what the ring holds and refuse what it lost, naming the seq; the pages rebuilt from the
// batches equal the tree's L1 and L2 pages.
func TestEventsOrderGapsAndReplay(t *testing.T) {
	ns := testNamespace(t)
	rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{})
	rc.events = EventOptions{Enabled: true, Ring: 8, Buffer: 4096}
	r := newRig(t, rc)
	for i, c := range r.caches[1:] {
		if _, _, err := c.Subscribe(0); !errors.Is(err, ErrNoEvents) {
			t.Fatalf("rank %d: Subscribe: %v, want ErrNoEvents", i+1, err)
		}
	}
	c0 := r.caches[0]
	live, cancel, err := c0.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	slow := newSlowSubscriber(t, c0)
	rng := rand.New(rand.NewPCG(25, 5))
	seqs := kvtest.RandomSequences(rng, 30, 4)
	set := newEventSet()
	var want uint64
	readAll := func() {
		for {
			select {
			case b := <-live:
				if b.Seq != want {
					t.Fatalf("live subscriber got batch %d, want %d", b.Seq, want)
				}
				want++
				set.apply(t, b)
			default:
				return
			}
		}
	}
	for k, s := range seqs {
		r.key = []string{"", "a"}[k%2]
		if _, err := r.insert(s); err != nil && !errors.Is(err, ErrL1Full) {
			t.Fatal(err)
		}
		if k%3 == 2 {
			if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(8); return err }); err != nil {
				t.Fatal(err)
			}
		}
		if k%10 == 9 {
			r.drain()
			if err := r.each("flush", func(_ int, c *Cache) error { return c.Flush(t.Context()) }); err != nil {
				t.Fatal(err)
			}
		}
		r.mustStep()
		readAll()
	}
	r.drain()
	readAll()
	next, _ := c0.NextEventSeq()
	if want != next || next < 20 {
		t.Fatalf("live subscriber read %d batches, NextEventSeq %d", want, next)
	}
	l1, l2 := c0.core.TreePagesForTest()
	if !sameSet(set[TierDevice], l1) || !sameSet(set[TierHost], l2) {
		t.Fatalf("rebuilt %d device / %d host pages; the tree holds %d / %d", len(set[TierDevice]), len(set[TierHost]), len(l1), len(l2))
	}
	// The slow subscriber's buffer (1) held batch 0 only: every later one was dropped.
	if got := slow.drain(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("slow subscriber got batches %v, want [0] (the rest dropped)", got)
	}
	// The ring holds the last 8 batches.
	bs, err := c0.EventsSince(next - 8)
	if err != nil || len(bs) != 8 || bs[0].Seq != next-8 || bs[7].Seq != next-1 {
		t.Fatalf("EventsSince(%d): %d batches, %v", next-8, len(bs), err)
	}
	if _, err := c0.EventsSince(next - 9); !errors.Is(err, ErrEventsGone) {
		t.Fatalf("EventsSince(%d): %v, want ErrEventsGone", next-9, err)
	}
	if _, _, err := c0.Subscribe(next - 9); !errors.Is(err, ErrEventsGone) {
		t.Fatalf("Subscribe(%d): %v, want ErrEventsGone", next-9, err)
	}
	again, cancel2, err := c0.Subscribe(next - 3)
	if err != nil {
		t.Fatal(err)
	}
	for k := next - 3; k < next; k++ {
		if b := <-again; b.Seq != k {
			t.Fatalf("replayed batch %d, want %d", b.Seq, k)
		}
	}
	cancel2()
	if _, ok := <-again; ok {
		t.Fatal("a canceled subscription's channel is open")
	}
}

func sameSet(a, b map[PageID]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for h := range a {
		if !b[h] {
			return false
		}
	}
	return true
}

// slowSubscriber subscribes with a one-batch buffer and never reads until drain.
type slowSubscriber struct {
	ch     <-chan EventBatch
	cancel func()
}

func newSlowSubscriber(t *testing.T, c *Cache) *slowSubscriber {
	c.events.mu.Lock()
	buf := c.events.buffer
	c.events.buffer = 1
	c.events.mu.Unlock()
	ch, cancel, err := c.Subscribe(0)
	c.events.mu.Lock()
	c.events.buffer = buf
	c.events.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &slowSubscriber{ch: ch, cancel: cancel}
}

func (s *slowSubscriber) drain() []uint64 {
	var got []uint64
	for {
		select {
		case b := <-s.ch:
			got = append(got, b.Seq)
		default:
			return got
		}
	}
}

// bigEvents is one stored page of tokens token ids.
func bigEvents(seq, tokens int) []Event {
	return []Event{{Kind: EventStored, Tier: TierDevice, Hashes: PrefixHashes([]int32{int32(seq)}, 1), Tokens: make([]int32, tokens)}}
}

// TestEventRingBoundedInBytes: the ring keeps at most RingBytes of batches (each batch
// carrying every page's token ids), whatever Ring says; NoRing keeps none and replays
// nothing, while subscriptions still get every new batch.
func TestEventRingBoundedInBytes(t *testing.T) {
	const tokens, bound = 16384, 1 << 20
	h, err := newEventHub(EventOptions{Enabled: true, Ring: 10000, RingBytes: bound}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		h.add(bigEvents(i, tokens))
	}
	per := EventBatchBytes(EventBatch{Events: bigEvents(0, tokens)})
	if h.ringBytes > bound || len(h.ring) != int(bound/per) {
		t.Fatalf("ring holds %d batches, %d bytes; want %d batches within %d bytes", len(h.ring), h.ringBytes, bound/per, bound)
	}
	if _, err := h.since(0); !errors.Is(err, ErrEventsGone) {
		t.Fatalf("since(0) after the bound: %v, want ErrEventsGone", err)
	}
	if got, err := h.since(999); err != nil || len(got) != 1 || got[0].Seq != 999 {
		t.Fatalf("since(999): %v, %v", got, err)
	}

	none, err := newEventHub(EventOptions{Enabled: true, NoRing: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := &subscription{ch: make(chan EventBatch, 10)}
	none.subs[s] = struct{}{}
	for i := 0; i < 5; i++ {
		none.add(bigEvents(i, tokens))
	}
	if len(none.ring) != 0 || none.ringBytes != 0 || len(s.ch) != 5 {
		t.Fatalf("NoRing: ring of %d batches (%d bytes), subscription got %d of 5", len(none.ring), none.ringBytes, len(s.ch))
	}
	if got, err := none.since(5); err != nil || len(got) != 0 {
		t.Fatalf("NoRing: since(next) = %v, %v", got, err)
	}
	if _, err := none.since(4); !errors.Is(err, ErrEventsGone) {
		t.Fatalf("NoRing: since(4): %v, want ErrEventsGone", err)
	}
}
