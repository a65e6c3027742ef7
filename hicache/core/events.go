package core

import "slices"

// KV events: what the replica holds in each tier, page by page, for KV-aware routers. The
// core derives them from replicated state only (every rank would compute the same events;
// the driver enables them on one rank), and hands them out in the order they took effect.

// Tier is where a page is held.
type Tier uint8

// Tiers.
const (
	TierDevice  Tier = iota // L1: the engine's KV pool
	TierHost                // L2: the shared slabs
	TierStorage             // L3: storage (pages whose backup the group agreed complete)
)

func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host"
	case TierStorage:
		return "storage"
	}
	return "tier(?)"
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	// EventStored: the pages Hashes (one run of a sequence, after the page Parent) are now
	// held in Tier.
	EventStored EventKind = iota
	// EventRemoved: the pages Hashes are no longer held in Tier.
	EventRemoved
	// EventCleared: nothing is held in any tier any more (a Flush, a Reset, or the recovery
	// that ends a quarantine); storage pages the flush kept are announced again right after.
	EventCleared
)

func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	}
	return "event(?)"
}

// Event is one change of what the replica holds. Hashes are page ids (the L3 keys derive
// from them); for EventStored, Parent is the id of the page before the first one
// (HasParent false when the run starts the sequence), Tokens are the run's tokens
// (len(Hashes) × PageSize) and Key is its isolation key. The slices are shared with the
// tree and never modified: the caller must not modify them either.
type Event struct {
	Kind      EventKind
	Tier      Tier
	Hashes    []PageID
	Parent    PageID
	HasParent bool
	Tokens    []int32
	Key       string
}

// evState is the core's event state (only while events are on).
type evState struct {
	on    bool
	nodes []*treeNode // nodes whose tiers may have changed since the last TakeEvents
	out   []Event     // events of resets and storage backups, in order, before the node diffs
	// storage: the runs whose backup the group agreed complete since the last time storage
	// was cleared (ForgetStorage), announced again after every EventCleared; have holds
	// their hashes.
	stored []Event
	have   map[PageID]struct{}
}

// EnableEvents turns the event stream on (from the current state: every page already held
// is reported as stored by the next TakeEvents) or off. Local: events are derived from
// replicated state, so one rank of the replica group may publish them alone.
func (c *Core) EnableEvents(on bool) {
	if on == c.ev.on {
		return
	}
	c.ev = evState{on: on}
	if !on {
		return
	}
	c.ev.have = map[PageID]struct{}{}
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		for _, ch := range n.children {
			ch.pubL1, ch.pubL2 = false, false
			c.evMark(ch)
			visit(ch)
		}
	}
	visit(c.root)
}

// EventsEnabled reports whether EnableEvents(true) is in force.
func (c *Core) EventsEnabled() bool { return c.ev.on }

func (c *Core) evMark(n *treeNode) {
	if c.ev.on && !n.evDirty && !n.isRoot() {
		n.evDirty = true
		c.ev.nodes = append(c.ev.nodes, n)
	}
}

// evReset records a reset of the tree: every tier is cleared, and the storage runs the
// reset kept are held again.
func (c *Core) evReset() {
	if !c.ev.on {
		return
	}
	for _, n := range c.ev.nodes {
		n.evDirty = false
	}
	c.ev.nodes = c.ev.nodes[:0]
	c.ev.out = append(c.ev.out, Event{Kind: EventCleared})
	c.ev.out = append(c.ev.out, c.ev.stored...)
}

// evStorage records that the backup of a run to storage completed on every I/O rank.
func (c *Core) evStorage(e Event) {
	if !c.ev.on {
		return
	}
	fresh := false
	for _, h := range e.Hashes {
		if _, ok := c.ev.have[h]; !ok {
			c.ev.have[h] = struct{}{}
			fresh = true
		}
	}
	if fresh {
		c.ev.stored = append(c.ev.stored, e)
		c.ev.out = append(c.ev.out, e)
	}
}

// ForgetStorage records that the storage namespace was cleared (Flush with ClearOnFlush):
// the storage tier holds nothing this replica knows of. Call it before the Reset of that
// flush. Local, as EnableEvents.
func (c *Core) ForgetStorage() {
	if c.ev.on {
		c.ev.stored = nil
		c.ev.have = map[PageID]struct{}{}
	}
}

// storedEvent is the EventStored of n's pages in tier t.
func storedEvent(n *treeNode, t Tier) Event {
	e := Event{Kind: EventStored, Tier: t, Hashes: n.hashes, Tokens: n.tokens, Key: n.key}
	if p := n.parent; p != nil && !p.isRoot() {
		e.Parent, e.HasParent = p.hashes[len(p.hashes)-1], true
	}
	return e
}

// TakeEvents appends the events since the last call to buf and returns it: first resets
// and storage backups in the order they happened, then, per node whose tiers changed, its
// pages removed (deepest nodes first) and stored (shallowest first, so a run's parent is
// announced before it). Nil when events are off.
func (c *Core) TakeEvents(buf []Event) []Event {
	if !c.ev.on {
		return buf
	}
	buf = append(buf, c.ev.out...)
	clear(c.ev.out)
	c.ev.out = c.ev.out[:0]
	nodes := c.ev.nodes
	slices.SortStableFunc(nodes, func(a, b *treeNode) int { return a.depth - b.depth })
	for i := len(nodes) - 1; i >= 0; i-- {
		n := nodes[i]
		live := !n.removed && n.gen == c.gen
		if n.pubL2 && (!live || n.l2 == nil) {
			buf = append(buf, Event{Kind: EventRemoved, Tier: TierHost, Hashes: n.hashes})
			n.pubL2 = false
		}
		if n.pubL1 && (!live || n.l1 == nil) {
			buf = append(buf, Event{Kind: EventRemoved, Tier: TierDevice, Hashes: n.hashes})
			n.pubL1 = false
		}
	}
	for _, n := range nodes {
		n.evDirty = false
		if n.removed || n.gen != c.gen {
			continue
		}
		if !n.pubL1 && n.l1 != nil {
			buf = append(buf, storedEvent(n, TierDevice))
			n.pubL1 = true
		}
		if !n.pubL2 && n.l2 != nil {
			buf = append(buf, storedEvent(n, TierHost))
			n.pubL2 = true
		}
	}
	clear(nodes)
	c.ev.nodes = nodes[:0]
	return buf
}

// TreePagesForTest returns the hashes of the pages the tree holds in L1 and in L2 (a full
// walk: for tests that compare them with what the events rebuilt). Read-only.
func (c *Core) TreePagesForTest() (l1, l2 map[PageID]bool) {
	l1, l2 = map[PageID]bool{}, map[PageID]bool{}
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		for _, ch := range n.children {
			for _, h := range ch.hashes {
				if ch.l1 != nil {
					l1[h] = true
				}
				if ch.l2 != nil {
					l2[h] = true
				}
			}
			visit(ch)
		}
	}
	visit(c.root)
	return l1, l2
}

// HeldPages returns the hashes of the pages the replica holds in each tier (indexed by
// Tier), as the events have reported them: L1 and L2 from the tree, storage from the
// backups the events announced (empty while events are off). A full walk: for snapshots
// and checks, not for every step. Read-only.
func (c *Core) HeldPages() [3][]PageID {
	var out [3][]PageID
	l1, l2 := c.TreePagesForTest()
	for i, set := range []map[PageID]bool{l1, l2} {
		for h := range set {
			out[i] = append(out[i], h)
		}
	}
	for h := range c.ev.have {
		out[TierStorage] = append(out[TierStorage], h)
	}
	for i := range out {
		slices.SortFunc(out[i], PageID.Compare)
	}
	return out
}
