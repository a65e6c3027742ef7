package core

import (
	"fmt"
	"math"
	"slices"

	"github.com/cpcache/cpcache/internal/mix"
	"github.com/cpcache/cpcache/slab/alloc"
)

// The L3 protocol in the core: backups of committed L2 nodes to storage, prefetches of a
// match's continuation from storage into L2, and the queue of reserved pages whose reads
// were cut short. Only the I/O rank of each slab group (CP rank 0) does storage I/O; every
// rank keeps the same queues, and only agreed vector slots move them.

// StorageKind is the kind of a storage job.
type StorageKind int

// Storage job kinds.
const (
	StoragePut   StorageKind = iota // back a node's L2 pages up to storage
	StorageQuery                    // how many leading pages of a continuation are stored
	StorageRead                     // read stored pages into reserved L2 pages
)

func (k StorageKind) String() string {
	return [...]string{"backup", "query", "prefetch read"}[k]
}

// l3Slots is how many queries (and reads) the vector answers per step.
const l3Slots = 4

// StorageJob is storage work the I/O rank's driver runs in the background; its result is
// reported back as a StorageDone.
type StorageJob struct {
	Kind   StorageKind
	Seq    uint64
	Node   uint64       // put: node id (messages)
	Hashes []uint64     // chained page hashes (storage keys)
	Pages  []alloc.Page // put: L2 sources; read: reserved L2 destinations
}

// putOp is a backup to storage in flight: the node's L2 pages are pinned (not evictable)
// until the group agreed every I/O rank finished.
type putOp struct {
	seq   uint64
	node  *Node
	pages int   // the node's pages when the backup started (a split may shorten the node)
	ev    Event // with events on: the run backed up, as an EventStored of the storage tier
	// local (I/O rank)
	done bool
	err  error
}

// queryOp asks the I/O ranks how much of a continuation is stored.
type queryOp struct {
	seq     uint64
	key     string  // isolation key
	tokens  []int32 // the sequence up to the continuation's end
	start   int     // first continuation page (sequence page index)
	hashes  []uint64
	revoked bool
	// local (I/O rank)
	answered bool
	hits     int
}

// readOp is a prefetch in flight: pages reserved in L2 (range rid, not a node), the I/O
// ranks reading stored pages into them.
type readOp struct {
	seq     uint64
	id      uint64 // the prefetch id (its query's id)
	rid     alloc.RangeID
	key     string // isolation key
	tokens  []int32
	start   int
	hashes  []uint64
	pages   []alloc.Page
	revoked bool
	stored  int             // leading pages the group agreed are stored (≥ len(pages))
	clamp   PrefetchRefusal // RefusedQuota when the quota left fewer than stored
	// local (I/O rank)
	done     bool
	progress int
	err      error
	wantCut  bool
}

// releaseOp is the unused part of a cut read: freed once every I/O rank's read stopped.
type releaseOp struct {
	seq     uint64
	rid     alloc.RangeID
	pages   int
	readSeq uint64
	acked   bool // local (I/O rank): the read's I/O has stopped
}

// l3State is the core's L3 state. Queues and seqs are replicated; the fields marked local
// in the ops are this rank's observations.
type l3State struct {
	puts       []*putOp
	queries    []*queryOp
	reads      []*readOp
	releases   []*releaseOp
	putSeq     uint64
	querySeq   uint64
	readSeq    uint64
	releaseSeq uint64
	reserved   int          // L2 pages held by reads and releases
	jobs       []StorageJob // to start (I/O rank only)
	stops      []uint64     // read seqs whose I/O must stop (I/O rank only)
	// outcomes of finished prefetches by id, the oldest first in outcomeIDs (at most
	// maxOutcomes; see Core.PrefetchOutcome)
	outcomes   map[uint64]PrefetchOutcome
	outcomeIDs []uint64
	// circuitOpen: the group agreed that an I/O rank's storage circuit breaker is open: no
	// prefetch or backup to storage is queued until it agrees the circuit closed again.
	circuitOpen bool
	localOpen   bool // local (I/O rank): this rank's breaker is open (StorageCircuit)
}

func (l *l3State) pending() int {
	return len(l.puts) + len(l.queries) + len(l.reads) + len(l.releases)
}

// StorageCircuit records whether this rank's storage circuit breaker is open (the driver
// calls it once per step, before Ready with a vector). Only an I/O rank's breaker counts: it
// contributes to the next vector, and the group opens or closes the circuit at the step it
// agrees. Local.
func (c *Core) StorageCircuit(open bool) { c.l3.localOpen = open }

// StorageCircuitOpen reports whether the group agreed the storage circuit open: no prefetch
// or backup to storage is queued; work already queued ends as misses or failed backups.
// Replicated.
func (c *Core) StorageCircuitOpen() bool { return c.l3.circuitOpen }

// l3Backup queues the backup of a freshly committed L2 node to storage and pins its pages
// (not while the storage circuit is open: the node stays in L2 without a storage copy).
func (c *Core) l3Backup(n *Node) {
	if c.l3.circuitOpen {
		return
	}
	op := &putOp{seq: c.l3.putSeq, node: n, pages: len(n.hashes)}
	if c.ev.on {
		op.ev = storedEvent(n, TierStorage)
	}
	c.l3.putSeq++
	c.l3.puts = append(c.l3.puts, op)
	n.l3Own++
	c.mark(n)
	c.pinL3(n, 1)
	if c.io {
		c.l3.jobs = append(c.l3.jobs, StorageJob{Kind: StoragePut, Seq: op.seq, Node: n.id, Hashes: slices.Clone(n.hashes), Pages: slices.Clone(n.l2)})
	}
}

// pinL3 adds d to the storage pins of n and its ancestors: a pinned node is not evicted
// from L2 and not dropped with an ancestor.
func (c *Core) pinL3(n *Node, d int) {
	for ; n != nil && !n.isRoot(); n = n.parent {
		n.l3Pins += d
		c.mark(n)
	}
}

// l3Done records that this rank's storage job finished (local event): a backup (err: it
// failed), a query (n leading pages stored) or a read (n leading pages read and verified;
// its I/O has stopped).
func (c *Core) l3Done(kind StorageKind, seq uint64, n int, err error) {
	switch kind {
	case StoragePut:
		for _, op := range c.l3.puts {
			if op.seq == seq {
				op.done, op.err = true, err
			}
		}
	case StorageQuery:
		for _, q := range c.l3.queries {
			if q.seq == seq {
				q.answered, q.hits = true, n
			}
		}
	case StorageRead:
		for _, r := range c.l3.reads {
			if r.seq == seq {
				r.done, r.progress, r.err = true, n, err
			}
		}
		for _, rel := range c.l3.releases {
			if rel.readSeq == seq {
				rel.acked = true
			}
		}
	}
}

// l3Progress records how many leading pages a read has completed so far (local), and
// whether this rank's timer asks to cut it.
func (c *Core) l3Progress(seq uint64, n int, cut bool) {
	for _, r := range c.l3.reads {
		if r.seq == seq && !r.done {
			r.progress = n
			r.wantCut = r.wantCut || cut
		}
	}
}

// l3Vector fills this rank's L3 slots. Ranks without storage I/O contribute the neutral
// value of each slot (MIN leaves the I/O ranks' values).
func (c *Core) l3Vector(v []int64) {
	v[vL3PutDone], v[vL3PutFail] = int64(c.l3.putSeq), math.MaxInt64
	v[vL3ReleaseAck] = int64(c.l3.releaseSeq)
	v[vL3Circuit] = 0
	if c.io && c.l3.localOpen {
		v[vL3Circuit] = -1
	}
	for i := range l3Slots {
		v[vL3QueryAns+i] = math.MaxInt64
		v[vL3ReadDone+i], v[vL3ReadPages+i], v[vL3ReadCut+i] = 1, math.MaxInt64, 0
	}
	if !c.io {
		return
	}
	for _, op := range c.l3.puts {
		if !op.done {
			v[vL3PutDone] = int64(op.seq)
			break
		}
		if op.err != nil && v[vL3PutFail] == math.MaxInt64 {
			v[vL3PutFail] = int64(op.seq)
		}
	}
	for _, rel := range c.l3.releases {
		if !rel.acked {
			v[vL3ReleaseAck] = int64(rel.seq)
			break
		}
	}
	for i := range min(l3Slots, len(c.l3.queries)) {
		if q := c.l3.queries[i]; q.revoked {
			v[vL3QueryAns+i] = 0 // nobody waits for it: a miss, whatever storage says
		} else if q.answered {
			v[vL3QueryAns+i] = int64(q.hits)
		} else {
			v[vL3QueryAns+i] = -1
		}
	}
	for i := range min(l3Slots, len(c.l3.reads)) {
		r := c.l3.reads[i]
		v[vL3ReadDone+i] = 0
		if r.done {
			v[vL3ReadDone+i] = 1
		}
		v[vL3ReadPages+i] = int64(r.progress)
		if r.wantCut {
			v[vL3ReadCut+i] = -1
		}
	}
}

// l3Apply applies the agreed L3 slots: acknowledged backups unpin their nodes, acknowledged
// releases free their pages, finished or cut reads insert the agreed pages, answered
// queries reserve L2 pages and start reads.
func (c *Core) l3Apply(v []int64) {
	c.l3.circuitOpen = v[vL3Circuit] < 0
	done, fail := uint64(v[vL3PutDone]), v[vL3PutFail]
	for len(c.l3.puts) > 0 && c.l3.puts[0].seq < done {
		op := c.l3.puts[0]
		c.l3.puts = c.l3.puts[1:]
		op.node.l3Own--
		c.pinL3(op.node, -1)
		if int64(op.seq) == fail {
			c.stats.L3FailedBackups++
			break
		}
		c.stats.L3BackedUpPages += int64(op.pages)
		c.evStorage(op.ev)
	}
	ack := uint64(v[vL3ReleaseAck])
	for len(c.l3.releases) > 0 && c.l3.releases[0].seq < ack {
		rel := c.l3.releases[0]
		c.l3.releases = c.l3.releases[1:]
		c.abortRange(rel.rid)
		c.l3.reserved -= rel.pages
	}
	policy := c.cfg.L3Config.PrefetchPolicy
	var finished []*readOp
	for i := range min(l3Slots, len(c.l3.reads)) {
		r := c.l3.reads[i]
		pages := int(min(max(v[vL3ReadPages+i], 0), int64(len(r.pages))))
		switch {
		case v[vL3ReadDone+i] >= 1:
			c.finishRead(r, pages, true, RefusedNone)
		case v[vL3ReadCut+i] < 0:
			c.finishRead(r, pages, false, RefusedCut)
		case r.revoked && policy != PrefetchWaitComplete:
			c.finishRead(r, pages, false, RefusedRevoked)
		default:
			continue
		}
		finished = append(finished, r)
	}
	if len(finished) > 0 {
		c.l3.reads = slices.DeleteFunc(c.l3.reads, func(r *readOp) bool { return slices.Contains(finished, r) })
	}
	var answered []*queryOp
	for i := range min(l3Slots, len(c.l3.queries)) {
		if a := v[vL3QueryAns+i]; a >= 0 {
			q := c.l3.queries[i]
			answered = append(answered, q)
			c.startRead(q, int(min(a, int64(len(q.hashes)))))
		}
	}
	if len(answered) > 0 {
		c.l3.queries = slices.DeleteFunc(c.l3.queries, func(q *queryOp) bool { return slices.Contains(answered, q) })
	}
}

func (c *Core) abortRange(id alloc.RangeID) {
	if err := c.alloc.Abort(id); err != nil {
		panic(fmt.Sprintf("hicache: abort of prefetch range %d: %v (replica invariant broken)", id, err))
	}
}

// dropL3 forgets every L3 operation (divergence): pins are released; reserved ranges are
// left to the abandoned allocator.
func (c *Core) dropL3() {
	for _, op := range c.l3.puts {
		op.node.l3Own--
		c.pinL3(op.node, -1)
	}
	c.l3 = l3State{putSeq: c.l3.putSeq, querySeq: c.l3.querySeq, readSeq: c.l3.readSeq, releaseSeq: c.l3.releaseSeq,
		circuitOpen: c.l3.circuitOpen, localOpen: c.l3.localOpen}
}

// l3Digest folds the L3 queue positions into the tree digest.
func (c *Core) l3Digest(x uint64) uint64 {
	l := &c.l3
	x = mix.Mix64(x ^ l.putSeq ^ l.querySeq<<16 ^ l.readSeq<<32 ^ l.releaseSeq<<48)
	if l.circuitOpen {
		x = mix.Mix64(x ^ 0xc1c)
	}
	return mix.Mix64(x ^ uint64(len(l.puts)) ^ uint64(len(l.queries))<<16 ^ uint64(len(l.reads))<<32 ^ uint64(len(l.releases))<<48 ^ uint64(l.reserved)<<8)
}
