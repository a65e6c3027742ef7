package core

import (
	"math"
	"strconv"

	"github.com/cpcache/cpcache/internal/mix"
)

// The consensus vector: what every rank contributes to the one AllReduce(MIN) of a step.
// Its length and layout are fixed; every slot is meaningful at every step. Values that must
// be equal on every rank travel as x and -x, so one MIN gives both min(x) and max(x) =
// -min(-x).
const (
	vConfig     = iota // configuration fingerprint (63 bits)
	vConfigNeg         //  and its negation
	vTree              // tree digest: nodes, L1 accounting, queue positions, step (63 bits)
	vTreeNeg           //  and its negation
	vPlace             // placement digest of the L2 allocator (63 bits)
	vPlaceNeg          //  and its negation
	vWriteDone         // seq of this rank's first unfinished backup (leading backups done)
	vWriteFail         // seq of this rank's first failed backup among those, or MaxInt64
	vLoadDone          // seq of this rank's first unfinished load-back
	vLoadFail          // seq of this rank's first failed load-back, or MaxInt64
	vEvictL1Neg        // -(L1 pages this rank asks to evict): MIN gives -max
	vEvictL2Neg        // -(L2 pages this rank asks to evict)
	vIdle              // 1 if this rank is idle (nothing in flight, no lock), else 0: MIN says all are
	// L3 (storage): every rank reports its share (the pages it owns); without L3 the slots
	// hold neutral values.
	vL3PutDone                             // seq of this rank's first unfinished backup to storage
	vL3PutFail                             // seq of its first failed one among those, or MaxInt64
	vL3ReleaseAck                          // seq of its first release whose read I/O has not stopped
	vL3Circuit                             // -1 if this rank's storage circuit breaker is open, else 0
	vL3ReadRate                            // this rank's measured read bandwidth, bytes/s (MaxInt64: none): MIN is the slowest
	vL3QueryAns                            // l3Slots slots: leading pages of query i this rank vouches for, -1 if unanswered
	vL3ReadDone   = vL3QueryAns + l3Slots  // l3Slots slots: 1 if this rank's part of read i finished, else 0
	vL3ReadPages  = vL3ReadDone + l3Slots  // l3Slots slots: leading pages of read i this rank vouches for so far
	vL3ReadCut    = vL3ReadPages + l3Slots // l3Slots slots: -1 if this rank's timer cuts read i
	VectorLen     = vL3ReadCut + l3Slots   // the vector's length
)

const mask63 = 1<<63 - 1

// treeDigest folds the O(1)-maintained tree state into 63 bits.
func (c *Core) treeDigest() int64 {
	c.flushDirty()
	x := mix.Mix64(c.treeSum ^ uint64(c.nodes)<<1)
	x = mix.Mix64(x ^ c.stateSum ^ c.lruClock<<24 ^ c.treeSalt<<56)
	for _, p := range c.l1.pools {
		x = mix.Mix64(x ^ uint64(p.used()))
	}
	x = mix.Mix64(x ^ c.writeSeq<<20 ^ c.loadSeq)
	x = mix.Mix64(x ^ uint64(len(c.writes))<<32 ^ uint64(len(c.loads)) ^ uint64(c.loadingPgs)<<16)
	x = mix.Mix64(x ^ c.step ^ uint64(c.locks)<<40)
	x = c.l3Digest(x)
	return int64(x & mask63)
}

// fillVector writes this rank's contribution to the step's consensus into every slot of v
// (of length VectorLen) and returns it (see Ready).
func (c *Core) fillVector(v []int64) []int64 {
	if c.perturb {
		c.perturb = false
		c.perturbPlacement()
	}
	if c.perturbTree {
		c.perturbTree = false
		c.perturbTreeNow()
	}
	fp := int64(c.fp & mask63)
	v[vConfig], v[vConfigNeg] = fp, -fp
	t := c.treeDigest()
	v[vTree], v[vTreeNeg] = t, -t
	d, nd := c.placementDigest()
	v[vPlace], v[vPlaceNeg] = d, nd
	v[vWriteDone], v[vWriteFail] = int64(c.writeSeq), math.MaxInt64
	for _, op := range c.writes {
		if !op.done {
			v[vWriteDone] = int64(op.seq)
			break
		}
		if op.err != nil && v[vWriteFail] == math.MaxInt64 {
			v[vWriteFail] = int64(op.seq)
		}
	}
	v[vLoadDone], v[vLoadFail] = int64(c.loadSeq), math.MaxInt64
	for _, op := range c.loads {
		if !op.done {
			v[vLoadDone] = int64(op.seq)
			break
		}
		if op.err != nil && v[vLoadFail] == math.MaxInt64 {
			v[vLoadFail] = int64(op.seq)
		}
	}
	v[vEvictL1Neg], v[vEvictL2Neg] = -int64(c.hintL1), -int64(c.hintL2)
	v[vIdle] = 0
	if c.Idle() {
		v[vIdle] = 1
	}
	c.l3Vector(v)
	return v
}

// Apply applies the agreed (all-reduced) vector of a step: it checks that the replicas
// agree, then commits or aborts the backups and loads every rank finished, and evicts what
// any rank asked for. Every rank applies the same vector and so makes the same changes.
//
// A disagreement returns a *DivergedError (wrapping ErrPlacementDiverged) on every rank and
// starts a quarantine (see Quarantined): backups and loads in flight are dropped (the driver
// must cancel and drain its transfers before any further step), nodes held only in L2 are
// removed, and the cache serves no hits until the first step at which every rank is idle,
// whose Apply resets every rank at once.
func (c *Core) Apply(v []int64) error {
	step := c.step
	c.step++
	c.stats.Steps++
	var derr error
	if len(v) != VectorLen {
		panic("core: consensus vector of wrong length")
	}
	// The digests are checked at every step. A mismatch outside quarantine starts one (on
	// every rank: the vector is the same); in quarantine the replicas are known to differ
	// and wait for the recovery.
	wasQuarantined := c.quarantined
	c.stats.DigestChecks++
	for _, chk := range digestSlots {
		lo, hi := v[chk.i], -v[chk.i+1]
		if lo != hi && !wasQuarantined {
			c.stats.DigestMismatches++
			c.stats.Divergences++
			derr = &DivergedError{Step: step, What: chk.what, Min: lo, Max: hi, Local: c.localValue(chk.i)}
			c.diverge()
			break
		}
	}
	if wasQuarantined {
		c.stats.QuarantinedSteps++
		if v[vIdle] == 1 {
			// Every rank is idle at this step: the agreed recovery flush. The rest of the
			// vector describes the abandoned state.
			c.recover()
			return nil
		}
	}
	if derr == nil && !c.quarantined {
		done, fail := uint64(v[vWriteDone]), v[vWriteFail]
		for len(c.writes) > 0 && c.writes[0].seq < done {
			op := c.writes[0]
			c.writes = c.writes[1:]
			if int64(op.seq) == fail {
				c.abortWrite(op)
				break
			}
			c.commitWrite(op)
		}
		done, fail = uint64(v[vLoadDone]), v[vLoadFail]
		for len(c.loads) > 0 && c.loads[0].seq < done {
			op := c.loads[0]
			c.loads = c.loads[1:]
			ok := int64(op.seq) != fail
			c.finishLoad(op, ok)
			if !ok {
				break
			}
		}
		c.l3Apply(v)
	}
	if n := -v[vEvictL1Neg]; n > 0 && !c.quarantined {
		c.evictL1Request(int(n))
	}
	if n := -v[vEvictL2Neg]; n > 0 && !c.quarantined {
		c.evictL2(int(n), nil)
	}
	c.hintL1, c.hintL2 = 0, 0
	return derr
}

// digestSlots are the vector's replicated values that Apply checks (each at i, its negation
// at i+1).
var digestSlots = [...]struct {
	what string
	i    int
}{{"config fingerprint", vConfig}, {"tree digest", vTree}, {"placement digest", vPlace}}

// localValue recomputes slot i of this rank's contribution (for error messages).
func (c *Core) localValue(i int) int64 {
	switch i {
	case vConfig:
		return int64(c.fp & mask63)
	case vTree:
		c.step-- // the contribution was made before the step counter moved
		t := c.treeDigest()
		c.step++
		return t
	case vPlace:
		d, _ := c.placementDigest()
		return d
	}
	return 0
}

// diverge stops L2 use: backups and loads in flight are dropped (their nodes keep L1 pages;
// loaded ones become stale), every node forgets its L2 copy, and nodes held only in L2 are
// removed. The allocator is left as it is (it is no longer trusted) until Reset.
func (c *Core) diverge() {
	c.quarantined = true
	for _, op := range c.writes {
		for _, part := range op.parts {
			part.node.write = nil
			part.node.evictAfterWrite = false
			c.mark(part.node)
		}
	}
	for _, op := range c.loads {
		for _, n := range op.nodes {
			n.load = nil
			n.stale = true
			c.mark(n)
		}
	}
	c.writes, c.loads, c.loadingPgs = nil, nil, 0
	c.out = nil
	c.dropL3()
	// Remove L2-only subtrees (their roots are children of L1 nodes or of the root), then
	// forget L2 copies everywhere.
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		for i := len(n.children) - 1; i >= 0; i-- {
			ch := n.children[i]
			if ch.l1 == nil {
				c.dropLocks(ch)
				c.removeSubtree(ch)
				continue
			}
			visit(ch)
		}
		if !n.isRoot() && n.l2 != nil {
			n.l2 = nil
			c.mark(n)
			c.relist(n, false)
		}
	}
	visit(c.root)
}

// dropLocks releases the locks held on n's subtree before a divergence removes it: the
// ancestors and the lock count forget them, and Unlock of a dropped node is a no-op.
func (c *Core) dropLocks(n *treeNode) {
	if n.lockRef == 0 {
		return
	}
	var visit func(x *treeNode)
	visit = func(x *treeNode) {
		if x.ownLocks > 0 {
			c.dropped[x.handle()] += x.ownLocks
		}
		c.locks -= x.ownLocks
		x.ownLocks = 0
		c.mark(x)
		for _, ch := range x.children {
			visit(ch)
		}
	}
	visit(n)
	c.lockPath(n.parent, -n.lockRef)
	n.lockRef = 0
	c.mark(n)
}

// Reset returns the core to its freshly constructed state: empty tree, all L1 slots free,
// no backups or loads, no hints, the L2 allocator Reset (the fresh digest), L2 enabled
// again. Only when Idle; otherwise ErrBusy and nothing changes. Replicated: call it
// identically on every rank (the driver's Flush runs a collective first). A Reset that
// ends a quarantine is a recovery (Stats.Recoveries), as the flush the group agrees by
// itself at its first idle step is.
func (c *Core) Reset() error {
	if !c.Idle() {
		return c.Busy()
	}
	if c.quarantined {
		c.stats.Recoveries++
	}
	c.reset()
	return nil
}

// recover ends a quarantine: the agreed flush of every rank at the first step where all are
// idle. Handles handed out before it are stale afterwards (ErrStaleHandle), as after Flush.
func (c *Core) recover() {
	c.reset()
	c.stats.Recoveries++
}

func (c *Core) reset() {
	c.evReset()
	c.resetTree()
	c.l1.reset()
	c.alloc.Reset()
	c.placeSalt = 0
	c.writes, c.loads, c.out = nil, nil, nil
	c.writeSeq, c.loadSeq, c.loadingPgs = 0, 0, 0
	c.hintL1, c.hintL2 = 0, 0
	c.quarantined = false
	c.l3 = l3State{}
}

// Busy returns nil when the core is idle (Flush may run), else an error wrapping ErrBusy
// that says what is outstanding.
func (c *Core) Busy() error {
	if c.Idle() {
		return nil
	}
	return &busyError{writes: len(c.writes), loads: len(c.loads), l3: c.l3.pending(), locks: c.locks}
}

type busyError struct{ writes, loads, l3, locks int }

func (e *busyError) Error() string {
	return "core: busy: " + strconv.Itoa(e.writes) + " backups, " + strconv.Itoa(e.loads) + " loads and " + strconv.Itoa(e.l3) +
		" storage operations in flight, " + strconv.Itoa(e.locks) + " locks held; flush needs an idle cache"
}

func (e *busyError) Unwrap() error { return ErrBusy }
