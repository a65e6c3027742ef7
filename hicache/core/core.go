package core

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/internal/mix"
	"github.com/cpcache/cpcache/slab/alloc"
)

// Core is the deterministic cache state machine of one rank: the radix tree, the L1
// accounting, the replicated L2 allocator, the queues of backups and loads in flight, and the
// consensus vector. It has no goroutines, clocks, I/O or collectives; a driver (Cache) runs
// the transfers it asks for and the consensus collective.
//
// Replicated inputs are the scheduler calls (Match, Insert, Lock, Unlock, EvictL1, EvictL2,
// LoadBack, Prefetch, RevokePrefetch, Reset) and Apply's agreed vector; every rank of the
// group must make them identically. Local inputs (Report, HintEvict, PerturbPlacement) only
// change what this rank contributes to the next vector. The work to do comes out of Ready
// (see boundary.go).
//
// A Core is not safe for concurrent use.
type Core struct {
	cfg   Config
	fp    uint64
	alloc *alloc.Allocator
	l1    *l1Pool

	root    *Node
	index   map[uint64]*Node // chained hash of a node's first page -> node
	nextID  uint64
	gen     uint64
	nodes   int
	treeSum uint64 // sum of nodeTerm over live nodes
	lruL1   lruList
	lruL2   lruList
	locks   int // outstanding Lock calls

	writes      []*writeOp // backups in flight, in seq order
	loads       []*loadOp  // load-backs in flight, in seq order
	writeSeq    uint64     // seq of the next backup
	loadSeq     uint64     // seq of the next load-back
	loadingPgs  int        // pages in loads
	hintL1      int        // local eviction requests (pages) for the next step
	hintL2      int
	out         []Transfer // transfers to start
	quarantined bool       // a digest diverged: no hits, inserts or slab I/O until the agreed recovery
	step        uint64     // Apply calls so far
	stats       Stats
	perturb     bool // PerturbPlacement: diverge this rank's allocator at the next vector
	perturbTree bool // PerturbTree: diverge this rank's tree at the next vector

	// The tree digest's O(1) part for node state: stateSum is the sum of every live node's
	// term; nodes whose state changed are in dirty and get a new term at the next vector.
	stateSum  uint64
	dirty     []*Node
	lruClock  uint64  // LRU moves so far (each node remembers its last one)
	treeSalt  uint64  // PerturbTree on an empty tree
	placeSalt uint64  // PerturbPlacement with L2 full
	l3        l3State // L3 queues (see l3core.go)
	ev        evState // KV events (local; see events.go)
}

// Stats are cumulative counters of one rank's core.
type Stats struct {
	Matches, Inserts           int64
	PromptTokens               int64 // tokens given to Match
	MissedTokens               int64 // of those, tokens in neither L1 nor L2 (storage hits are among them)
	L1HitPages, L2HitPages     int64 // pages matched in L1 / only in L2
	InsertedPages              int64 // pages that got L1 slots from Insert
	WrittenPages, LoadedPages  int64 // pages of committed backups / completed load-backs (all ranks)
	AbortedWrites, FailedLoads int64
	SkippedBackups             int64 // backups that found no L2 space
	EvictedL1Pages             int64
	EvictedL2Pages             int64
	DroppedNodes               int64 // nodes removed from every tier
	Steps                      int64
	DigestChecks               int64
	DigestMismatches           int64 // steps that found a digest diverged (each starts a quarantine)
	Divergences                int64 // quarantines entered
	Recoveries                 int64 // agreed recovery flushes that ended a quarantine
	QuarantinedSteps           int64 // steps applied in quarantine
	// L3 (storage), agreed (equal on every rank):
	L3Queries           int64 // prefetch queries made
	L3HitPages          int64 // leading pages every rank found stored (storage hits)
	L3PrefetchedPages   int64 // pages inserted into the tree from storage
	L3DiscardedPages    int64 // reserved pages released unused (cut reads, short reads, tree changed)
	L3SkippedPrefetches int64 // hits not read (below the threshold, quota, no L2 room, revoked, tree changed, cost)
	L3CostSkippedPages  int64 // stored pages not read because computing them is faster (L3Config.Cost)
	L3CostProbes        int64 // prefetches read although the measured bandwidth said skip (PrefetchCost.MeasuredReads)
	L3BackedUpPages     int64 // pages of backups to storage every rank stored its part of
	L3FailedBackups     int64 // backups to storage that failed on some rank
}

// New returns an empty core.
func New(cfg Config) (*Core, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	alloc, err := alloc.New(cfg.Slabs, cfg.PagesPerSlab)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	c := &Core{cfg: cfg, fp: cfg.fingerprint(), alloc: alloc, l1: newL1Pool(cfg.L1Pages)}
	c.resetTree()
	return c, nil
}

func (c *Core) resetTree() {
	c.gen++
	c.root = &Node{gen: c.gen}
	c.index = map[uint64]*Node{}
	c.nextID = 1
	c.nodes = 0
	c.treeSum = 0
	c.lruL1.init()
	c.lruL2.init()
	c.locks = 0
	c.stateSum, c.dirty, c.lruClock = 0, nil, 0
	c.treeSalt = 0
}

// mark records that n's state changed: its term is recomputed at the next vector.
func (c *Core) mark(n *Node) {
	if n == nil || n.isRoot() {
		return
	}
	c.evMark(n)
	if n.dirty {
		return
	}
	n.dirty = true
	c.dirty = append(c.dirty, n)
}

// flushDirty brings stateSum up to date with the nodes marked since the last call.
func (c *Core) flushDirty() {
	for _, n := range c.dirty {
		n.dirty = false
		if n.removed {
			continue // its term left the sum when it was removed
		}
		c.stateSum -= n.term
		n.term = stateTerm(n)
		c.stateSum += n.term
	}
	clear(c.dirty)
	c.dirty = c.dirty[:0]
}

// Config returns the normalized configuration.
func (c *Core) Config() Config { return c.cfg }

// Allocator exposes the replicated L2 allocator for inspection (digests, free counts). Do not
// mutate it.
func (c *Core) Allocator() *alloc.Allocator { return c.alloc }

// Stats returns the counters.
func (c *Core) Stats() Stats { return c.stats }

// Fingerprint is the configuration fingerprint the ranks of a group must share.
func (c *Core) Fingerprint() uint64 { return c.fp }

// NextStep is the number of the next consensus step (the Apply calls so far).
func (c *Core) NextStep() uint64 { return c.step }

// LoadInFlight reports whether the group has not yet finished load-back seq.
func (c *Core) LoadInFlight(seq uint64) bool { return len(c.loads) > 0 && seq >= c.loads[0].seq }

// Queues are the lengths of the replicated queues of work in flight.
type Queues struct {
	Writes, Loads                  int    // L2 backups and load-backs
	Puts, Queries, Reads, Releases int    // storage backups, queries, prefetch reads, releases
	ReservedPages                  int    // L2 pages held by storage reads and releases
	PutSeq                         uint64 // seq of the next backup to storage
}

// Queues returns the queue lengths (tests and diagnostics).
func (c *Core) Queues() Queues {
	return Queues{Writes: len(c.writes), Loads: len(c.loads), Puts: len(c.l3.puts), Queries: len(c.l3.queries),
		Reads: len(c.l3.reads), Releases: len(c.l3.releases), ReservedPages: c.l3.reserved, PutSeq: c.l3.putSeq}
}

// TreeL2Pages counts the L2 pages the tree's nodes hold, by walking the tree (diagnostics:
// an independent check of the allocator's accounting).
func (c *Core) TreeL2Pages() int {
	n := 0
	var visit func(x *Node)
	visit = func(x *Node) {
		n += len(x.l2)
		for _, ch := range x.children {
			visit(ch)
		}
	}
	visit(c.root)
	return n
}

// Peek returns the deepest node whose pages all match a prefix of tokens, without touching
// LRU order or counters (nil when nothing matches). Read-only: a rank may call it alone.
func (c *Core) Peek(tokens []int32) *Node { return c.PeekKey("", tokens) }

// PeekKey is Peek under isolation key key.
func (c *Core) PeekKey(key string, tokens []int32) *Node {
	var buf [walkBuf]pathMatch
	path := c.walk(buf[:0], key, tokens)
	for i := len(path) - 1; i >= 0; i-- {
		if path[i].pages == len(path[i].n.hashes) {
			return path[i].n
		}
	}
	return nil
}

// PerturbPlacement is a fault injection: at the next vector this rank reserves an L2 range
// that no other rank knows of (one free page; when L2 is full, it salts its placement digest
// instead), so its placement digest differs and the step detects a divergence. Local.
func (c *Core) PerturbPlacement() { c.perturb = true }

// perturbRange is the first range id PerturbPlacement reserves (node ids stay far below).
const perturbRange alloc.RangeID = 1 << 40

func (c *Core) perturbPlacement() {
	id := perturbRange
	for {
		if _, _, ok := c.alloc.Range(id); !ok {
			break
		}
		id++ // perturbed before, in a quarantine or a group of one rank
	}
	for s := range c.cfg.Slabs {
		if c.alloc.FreePages(s) > 0 {
			if _, err := c.alloc.Reserve(id, s, 1); err == nil { // sequence page s lives in slab s
				return
			}
		}
	}
	c.placeSalt++ // L2 is full
}

// placementDigest is the placement digest this rank contributes: the allocator's, salted
// by a PerturbPlacement that found L2 full.
func (c *Core) placementDigest() (d, negD int64) {
	if c.placeSalt == 0 {
		return c.alloc.DigestPair()
	}
	d = int64((c.alloc.Digest() ^ mix.Mix64(c.placeSalt)) & mask63)
	return d, -d
}

// L2Enabled is false in quarantine: after a divergence, until the agreed recovery (or Reset).
func (c *Core) L2Enabled() bool { return !c.quarantined }

// Quarantined reports whether the group is in quarantine after a divergence: Match serves
// no hits, Insert caches nothing and no slab I/O starts, until the first step at which
// every rank is idle, when every rank resets at once (Stats.Recoveries). Replicated.
func (c *Core) Quarantined() bool { return c.quarantined }

// PerturbTree is a fault injection: at the next vector this rank moves its least recently
// used node to the back of its LRU list (or, on an empty tree, salts its digest), so its tree
// digest differs and the step detects a divergence. Local.
func (c *Core) PerturbTree() { c.perturbTree = true }

func (c *Core) perturbTreeNow() {
	switch {
	case c.lruL1.front() != nil:
		c.relist(c.lruL1.front(), true)
	case c.lruL2.front() != nil:
		c.relist(c.lruL2.front(), true)
	default:
		c.treeSalt++
	}
}

// Owns reports whether this rank owns sequence page i (holds it in L1, writes its backup).
func (c *Core) Owns(i int) bool { return i%c.cfg.Slabs == c.cfg.CPRank }

// L1Used is the number of L1 slots in use.
func (c *Core) L1Used() int { return c.l1.used() }

// Nodes is the number of tree nodes (without the root).
func (c *Core) Nodes() int { return c.nodes }

// Idle reports whether nothing is in flight and nothing is locked (Flush's precondition).
func (c *Core) Idle() bool { return !c.inFlight() && c.locks == 0 }

// inFlight reports whether any backup, load or L3 operation is in flight.
func (c *Core) inFlight() bool { return c.Pending() > 0 }

// Pending is the number of backups, loads and L3 operations (storage backups, prefetch
// queries and reads, releases) in flight. Replicated.
func (c *Core) Pending() int { return len(c.writes) + len(c.loads) + c.l3.pending() }

func (c *Core) check(n *Node) error {
	if n == nil || n.removed || n.gen != c.gen {
		return fmt.Errorf("%w: node %v is not in the tree (evicted, or from before a flush)", ErrBadArgument, nodeName(n))
	}
	return nil
}

func nodeName(n *Node) string {
	if n == nil {
		return "<nil>"
	}
	return fmt.Sprintf("#%d", n.id)
}

// pathMatch is one node of a walk and how many of its pages matched.
type pathMatch struct {
	n     *Node
	pages int
}

// walkBuf is the path length that walk's callers hold on the stack.
const walkBuf = 16

// walk matches whole pages of tokens under isolation key key from the root and appends the
// path to path (callers pass a stack buffer: var buf [walkBuf]pathMatch; c.walk(buf[:0],
// key, tokens)); every node but the last is matched fully. The key seeds the chained hashes
// (KeyRoot), so a walk under one key never reaches another key's nodes.
func (c *Core) walk(path []pathMatch, key string, tokens []int32) []pathMatch {
	P := c.cfg.PageSize
	np := len(tokens) / P
	n, h, pos := c.root, KeyRoot(key), 0
	for pos < np {
		ph := PageHash(h, tokens[pos*P:(pos+1)*P])
		child := c.index[ph]
		if child == nil || child.parent != n || child.key != key || !slices.Equal(child.tokens[:P], tokens[pos*P:(pos+1)*P]) {
			break
		}
		h = ph
		j := 1
		for j < len(child.hashes) && pos+j < np {
			q := tokens[(pos+j)*P : (pos+j+1)*P]
			ph = PageHash(h, q)
			if ph != child.hashes[j] || !slices.Equal(child.tokens[j*P:(j+1)*P], q) {
				break
			}
			h = ph
			j++
		}
		path = append(path, pathMatch{child, j})
		pos += j
		if j < len(child.hashes) {
			break
		}
		n = child
	}
	return path
}

// touch moves n and its ancestors to the back of their LRU lists, deepest first.
func (c *Core) touch(n *Node) {
	for ; n != nil && !n.isRoot(); n = n.parent {
		c.relist(n, true)
	}
}

// relist puts n in the list its tiers call for; toBack moves it to the back even when it
// stays in the same list.
func (c *Core) relist(n *Node, toBack bool) {
	want := int8(inNoList)
	switch {
	case n.removed:
	case n.l1 != nil:
		want = inL1List
	case n.l2 != nil:
		want = inL2List
	}
	if want == n.list && !toBack {
		return
	}
	c.mark(n)
	n.lruSeq = c.lruClock
	c.lruClock++
	switch n.list {
	case inL1List:
		c.lruL1.remove(n)
	case inL2List:
		c.lruL2.remove(n)
	}
	n.list = want
	switch want {
	case inL1List:
		c.lruL1.pushBack(n)
	case inL2List:
		c.lruL2.pushBack(n)
	}
}

func (c *Core) setL1(n *Node, slots []int32) {
	if n.l1 == nil && n.parent != nil {
		n.parent.l1Kids++
	}
	n.l1 = slots
	n.stale = false
	c.mark(n)
	c.mark(n.parent)
	c.relist(n, false)
}

func (c *Core) clearL1(n *Node) {
	if n.l1 == nil {
		return
	}
	c.l1.release(n.l1)
	n.l1 = nil
	n.stale = false
	n.parent.l1Kids--
	c.mark(n)
	c.mark(n.parent)
	c.relist(n, false)
}

// newNode creates a child of parent holding pages of tokens (whole pages) with their
// chained hashes under isolation key key (a child of a node has its parent's key). It
// returns nil when the first page's hash is already taken by another node (a 64-bit
// collision): the caller stops inserting there.
func (c *Core) newNode(parent *Node, key string, tokens []int32, hashes []uint64) *Node {
	n := c.newNodeID(parent, key, tokens, hashes, c.nextID)
	if n != nil {
		c.nextID++
	}
	return n
}

// newNodeID is newNode with a given id (not taken from nextID).
func (c *Core) newNodeID(parent *Node, key string, tokens []int32, hashes []uint64, id uint64) *Node {
	if c.index[hashes[0]] != nil {
		return nil
	}
	n := &Node{id: id, gen: c.gen, parent: parent, key: key, tokens: tokens, hashes: hashes}
	if !parent.isRoot() {
		n.depth = parent.depth + len(parent.hashes)
	}
	parent.children = append(parent.children, n)
	c.index[hashes[0]] = n
	c.nodes++
	c.treeSum += nodeTerm(n)
	c.mark(n)
	c.mark(parent)
	return n
}

// split divides n after its first at pages: a new node (the head) takes them and becomes
// n's parent. A node with I/O in flight is split too: its allocator range (committed, or
// reserved by a backup in flight) is split at the same page, and the head joins n's backup
// and load-back ops (splitIO), so both halves commit, abort or finish together at the step
// the group agrees on; no page changes place. Returns the head.
func (c *Core) split(n *Node, at int) *Node {
	P := c.cfg.PageSize
	c.treeSum -= nodeTerm(n)
	head := &Node{
		id: c.nextID, gen: c.gen, parent: n.parent, key: n.key, depth: n.depth,
		tokens: n.tokens[: at*P : at*P], hashes: n.hashes[:at:at],
		stale: n.stale, lockRef: n.lockRef, l3Pins: n.l3Pins, hits: n.hits, children: []*Node{n},
		pubL1: n.pubL1, pubL2: n.pubL2, // the head's pages were published with n's
	}
	c.nextID++
	if n.l1 != nil {
		head.l1 = n.l1[:at:at]
		n.l1 = n.l1[at:]
		head.l1Kids = 1
	}
	if (n.l2 != nil || n.write != nil) && !c.quarantined {
		if err := c.alloc.Split(alloc.RangeID(n.id), at, alloc.RangeID(head.id)); err != nil {
			panic(fmt.Sprintf("hicache: allocator split of node %d: %v (replica invariant broken)", n.id, err))
		}
	}
	if n.l2 != nil {
		head.l2 = n.l2[:at:at]
		n.l2 = n.l2[at:]
	}
	splitIO(n, head, at)
	p := n.parent
	p.children[slices.Index(p.children, n)] = head
	n.parent = head
	n.tokens, n.hashes = n.tokens[at*P:], n.hashes[at:]
	n.depth += at
	c.index[head.hashes[0]] = head
	c.index[n.hashes[0]] = n
	c.nodes++
	c.treeSum += nodeTerm(n) + nodeTerm(head)
	// The head goes right behind n in n's list: behind its descendant, ahead of the rest.
	c.mark(head)
	c.mark(n)
	c.mark(head.parent)
	if n.list != inNoList {
		head.list, head.lruSeq = n.list, n.lruSeq
		head.prev, head.next = n, n.next
		n.next.prev = head
		n.next = head
		if n.list == inL1List {
			c.lruL1.n++
		} else {
			c.lruL2.n++
		}
	}
	return head
}

// removeSubtree drops n and its descendants from every tier. Callers guarantee that no node
// of the subtree holds L1 pages other than n itself and that none has I/O in flight.
func (c *Core) removeSubtree(n *Node) {
	for len(n.children) > 0 {
		c.removeSubtree(n.children[len(n.children)-1])
	}
	if n.l2 != nil {
		if !c.quarantined {
			if err := c.alloc.Free(alloc.RangeID(n.id)); err != nil {
				panic(fmt.Sprintf("hicache: allocator free of node %d: %v (replica invariant broken)", n.id, err))
			}
		}
		n.l2 = nil
	}
	c.clearL1(n)
	n.parent.unlinkChild(n)
	delete(c.index, n.hashes[0])
	c.treeSum -= nodeTerm(n)
	c.stateSum -= n.term
	n.term = 0
	c.nodes--
	n.removed = true
	c.evMark(n)
	c.relist(n, false)
	c.stats.DroppedNodes++
}

// pathTo returns the nodes from the root's child down to n.
func pathTo(n *Node) []*Node {
	var p []*Node
	for ; n != nil && !n.isRoot(); n = n.parent {
		p = append(p, n)
	}
	slices.Reverse(p)
	return p
}

func (c *Core) lockPath(n *Node, d int) {
	for ; n != nil && !n.isRoot(); n = n.parent {
		n.lockRef += d
		c.mark(n)
	}
}

// Lock pins n and its ancestors: none of them is evicted from any tier until Unlock. A
// running request holds a lock on its matched prefix.
func (c *Core) Lock(n *Node) error {
	if n != nil && n.isRoot() {
		return nil
	}
	if err := c.check(n); err != nil {
		return err
	}
	c.lockPath(n, 1)
	n.ownLocks++
	c.locks++
	return nil
}

// Unlock releases one Lock of n.
func (c *Core) Unlock(n *Node) error {
	if n != nil && n.isRoot() {
		return nil
	}
	if n != nil && n.removed && n.droppedLocks > 0 {
		n.droppedLocks-- // the node was locked when a divergence dropped it
		return nil
	}
	if err := c.check(n); err != nil {
		return err
	}
	if n.ownLocks <= 0 {
		return fmt.Errorf("%w: unlock of node %d, which is not locked", ErrBadArgument, n.id)
	}
	c.lockPath(n, -1)
	n.ownLocks--
	c.locks--
	return nil
}
