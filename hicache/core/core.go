package core

import (
	"fmt"

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
// and the step's consensus contribution out of Vector (see boundary.go).
//
// A Core is not safe for concurrent use.
type Core struct {
	cfg   Config
	fp    uint64
	alloc *alloc.Allocator
	l1    l1Pools // one pool per CP rank
	adopt []int32 // EngineOwned: during an InsertSlots/LoadBackSlots, the caller's slot of sequence page i not yet adopted, else -1

	root      *treeNode
	index     map[uint64]*treeNode // index of the id of a node's first page -> chain of nodes (indexGet)
	indexMask uint64               // the bits of PageID.Index the index uses: all, but for tests
	hs        hasher               // page ids (hash.go)
	byID      map[uint64]*treeNode // node id -> node, the root (id 0) included: what handles name
	// dropped counts the locks held on nodes a divergence removed, by handle: Unlock of such
	// a handle is a no-op that uses one up, also after the recovery.
	dropped map[Handle]int
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
	dirty     []*treeNode
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
	DroppedL2CopyPages         int64 // L2 copies of stored L1 pages freed for room (the L1 pages stay)
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
	c := &Core{cfg: cfg, fp: cfg.fingerprint(), alloc: alloc, l1: newL1Pools(cfg.Slabs, cfg.L1Pages, cfg.L1Mode, cfg.CPRank), gen: cfg.Generation, dropped: map[Handle]int{}}
	c.resetTree()
	return c, nil
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
	var visit func(x *treeNode)
	visit = func(x *treeNode) {
		n += len(x.l2)
		for _, ch := range x.children {
			visit(ch)
		}
	}
	visit(c.root)
	return n
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

// L1Used is the number of this rank's L1 slots in use: the pages it owns that L1 holds.
func (c *Core) L1Used() int { return c.l1.pools[c.cfg.CPRank].used() }

// L1UsedBy is the number of CP rank r's L1 slots in use (every rank knows every rank's
// pool: the accounting is replicated). r must be in 0..C-1.
func (c *Core) L1UsedBy(r int) int { return c.l1.pools[r].used() }

// L1UsedAll is the number of L1 slots in use on all CP ranks together: the pages of the
// tree held in L1.
func (c *Core) L1UsedAll() int {
	n := 0
	for _, p := range c.l1.pools {
		n += p.used()
	}
	return n
}

// Nodes is the number of tree nodes (without the root).
func (c *Core) Nodes() int { return c.nodes }

// Idle reports whether nothing is in flight and nothing is locked (Flush's precondition).
func (c *Core) Idle() bool { return !c.inFlight() && c.locks == 0 }

// inFlight reports whether any backup, load or L3 operation is in flight.
func (c *Core) inFlight() bool { return c.Pending() > 0 }

// Pending is the number of backups, loads and L3 operations (storage backups, prefetch
// queries and reads, releases) in flight. Replicated.
func (c *Core) Pending() int { return len(c.writes) + len(c.loads) + c.l3.pending() }
