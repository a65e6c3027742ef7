package hicache

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
)

// KV events (see "KV events" in the package doc): what a replica holds in each tier, for
// KV-aware routers.
type (
	// Event is one change of what the replica holds (see core.Event).
	Event = core.Event
	// EventKind says what an Event reports (see core.EventKind).
	EventKind = core.EventKind
	// Tier is where pages are held (see core.Tier).
	Tier = core.Tier
)

// Event kinds and tiers (see package core).
const (
	EventStored  = core.EventStored
	EventRemoved = core.EventRemoved
	EventCleared = core.EventCleared
	TierDevice   = core.TierDevice
	TierHost     = core.TierHost
	TierStorage  = core.TierStorage
)

// EventOptions turns the KV event stream on. Only the replica group's rank 0 publishes: the
// events come from agreed state, so one rank tells everything; on the other ranks Subscribe
// fails with ErrNoEvents.
type EventOptions struct {
	Enabled bool
	// Ring is how many recent batches are kept for Subscribe's and EventsSince's replay
	// (default 10000).
	Ring int
	// RingBytes bounds the ring in bytes as well (default 64 MiB): a batch costs its
	// events' hashes, token ids and keys plus a fixed overhead (EventBatchBytes), and the
	// oldest batches leave first.
	RingBytes int64
	// NoRing keeps no batches at all (Ring and RingBytes are then ignored): Subscribe
	// serves only batches still to come and EventsSince has nothing older than
	// NextEventSeq. For a subscriber that does not replay (a publisher without a replay
	// socket keeps nothing either).
	NoRing bool
	// Buffer is each subscription's channel capacity in batches (default 1024). A
	// subscriber that falls further behind loses batches (never blocking a Step): it sees
	// the gap in Seq and replays it with EventsSince while the ring still holds it.
	Buffer int
}

// ErrNoEvents: events are not enabled, or this rank does not publish them (rank 0 of the
// replica group does).
var ErrNoEvents = errors.New("hicache: KV events are not published by this rank")

// ErrEventsGone: the batches asked for have left the replay ring.
var ErrEventsGone = errors.New("hicache: KV event batches are no longer in the replay ring")

// EventBatch is the events of one Step (or Flush) of a replica, in the order they took
// effect. Seq numbers a replica's batches 0, 1, 2, ... without gaps; a step that changed
// nothing makes no batch.
type EventBatch struct {
	Seq     uint64
	Time    time.Time // when the step applied
	Replica int       // the replica group's DP index
	Events  []Event
}

// eventHub numbers batches, keeps the replay ring and feeds the subscriptions.
type eventHub struct {
	replica int
	buffer  int

	ringMax   int   // most batches the ring keeps (0: none)
	ringBound int64 // most bytes the ring keeps (EventBatchBytes)

	mu        sync.Mutex   // guards everything below
	next      uint64       // seq of the next batch
	ring      []EventBatch // oldest first
	ringBytes int64
	subs      map[*subscription]struct{}
}

type subscription struct {
	ch      chan EventBatch
	dropped int
}

func newEventHub(o EventOptions, replica int) (*eventHub, error) {
	switch {
	case o.Ring < 0:
		return nil, fmt.Errorf("%w: events ring %d must not be negative", ErrBadConfig, o.Ring)
	case o.RingBytes < 0:
		return nil, fmt.Errorf("%w: events ring bytes %d must not be negative", ErrBadConfig, o.RingBytes)
	case o.Buffer < 0:
		return nil, fmt.Errorf("%w: events buffer %d must not be negative", ErrBadConfig, o.Buffer)
	}
	if o.Ring == 0 {
		o.Ring = 10000
	}
	if o.RingBytes == 0 {
		o.RingBytes = 64 << 20
	}
	if o.NoRing {
		o.Ring, o.RingBytes = 0, 0
	}
	if o.Buffer == 0 {
		o.Buffer = 1024
	}
	return &eventHub{replica: replica, buffer: o.Buffer, ringMax: o.Ring, ringBound: o.RingBytes, subs: map[*subscription]struct{}{}}, nil
}

// batchOverhead is what EventBatchBytes counts for a batch and for each event beside their
// slices' contents.
const batchOverhead = 64

// EventBatchBytes is what a batch holds in memory, as the ring counts it: its events'
// page ids (core.PageIDSize bytes each), token ids (4 bytes each) and keys, plus a fixed overhead per batch
// and per event.
func EventBatchBytes(b EventBatch) int64 {
	n := int64(batchOverhead)
	for _, e := range b.Events {
		n += batchOverhead + core.PageIDSize*int64(len(e.Hashes)) + 4*int64(len(e.Tokens)) + int64(len(e.Key))
	}
	return n
}

// RingSize is what the replay ring holds: batches and their EventBatchBytes. Local.
func (c *Cache) RingSize() (batches int, bytes int64) {
	h := c.events
	if h == nil {
		return 0, 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ring), h.ringBytes
}

// publish takes the core's events and, when there are any, publishes them as one batch.
// The caller holds the Cache's mutex (the core is read); sends never block.
func (h *eventHub) publish(cr *core.Core) {
	if h == nil {
		return
	}
	h.add(cr.TakeEvents(nil))
}

// add publishes evs as one batch when there are any.
func (h *eventHub) add(evs []Event) {
	if len(evs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	b := EventBatch{Seq: h.next, Time: time.Now(), Replica: h.replica, Events: evs}
	h.next++
	if h.ringMax > 0 {
		h.ring = append(h.ring, b)
		h.ringBytes += EventBatchBytes(b)
		drop := 0
		for drop < len(h.ring) && (len(h.ring)-drop > h.ringMax || h.ringBytes > h.ringBound) {
			h.ringBytes -= EventBatchBytes(h.ring[drop])
			h.ring[drop] = EventBatch{} // the batch's slices go with it
			drop++
		}
		h.ring = h.ring[drop:]
		if len(h.ring) == 0 {
			h.ring = nil
		}
	}
	for s := range h.subs {
		send(s, b)
	}
}

func send(s *subscription, b EventBatch) {
	select {
	case s.ch <- b:
	default:
		s.dropped++
	}
}

// since returns the ring's batches from seq on (h.mu held).
func (h *eventHub) since(seq uint64) ([]EventBatch, error) {
	oldest := h.next - uint64(len(h.ring))
	if seq < oldest {
		return nil, fmt.Errorf("%w: batch %d asked, the oldest kept is %d (ring of %d batches, %d bytes)", ErrEventsGone, seq, oldest, h.ringMax, h.ringBound)
	}
	var out []EventBatch
	for _, b := range h.ring {
		if b.Seq >= seq {
			out = append(out, b)
		}
	}
	return out, nil
}

// Subscribe returns a channel of this replica's event batches from seq fromSeq on: the ones
// still in the replay ring first, then each new one as its Step applies, in Seq order. It
// fails with ErrEventsGone when fromSeq is older than the ring; a router that starts late
// takes HeldPages as its snapshot and subscribes from NextEventSeq. A subscription whose
// channel is full loses batches instead of slowing a Step: Seq then jumps, and EventsSince
// replays the gap. cancel ends the subscription and closes the channel; Close closes every
// channel. Local.
func (c *Cache) Subscribe(fromSeq uint64) (batches <-chan EventBatch, cancel func(), err error) {
	h := c.events
	if h == nil {
		return nil, nil, ErrNoEvents
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		return nil, nil, ErrClosed
	}
	old, err := h.since(fromSeq)
	if err != nil {
		return nil, nil, err
	}
	s := &subscription{ch: make(chan EventBatch, h.buffer)}
	for _, b := range old {
		send(s, b)
	}
	h.subs[s] = struct{}{}
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if _, ok := h.subs[s]; ok {
				delete(h.subs, s)
				close(s.ch)
			}
		})
	}, nil
}

// EventsSince returns the batches from seq on that the replay ring still holds
// (ErrEventsGone when seq is older). Local.
func (c *Cache) EventsSince(seq uint64) ([]EventBatch, error) {
	h := c.events
	if h == nil {
		return nil, ErrNoEvents
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.since(seq)
}

// NextEventSeq is the Seq the next batch will have (0 before the first). Local.
func (c *Cache) NextEventSeq() (uint64, error) {
	h := c.events
	if h == nil {
		return 0, ErrNoEvents
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next, nil
}

// closeSubs closes every subscription (Cache.Close).
func (h *eventHub) closeSubs() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		close(s.ch)
	}
	h.subs = nil
}

// HeldPages returns the ids of the pages this replica holds in each tier (indexed by
// Tier; storage: the backups the events announced), sorted: what a subscriber that applied
// every batch so far has rebuilt. A full walk of the tree. Local.
func (c *Cache) HeldPages() [3][]PageID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.HeldPages()
}
