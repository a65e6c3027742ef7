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
// were cut short. Every rank does the storage I/O of the pages it owns (sequence page i is
// CP rank i mod C's and lives in its slab), with its own storage handle: no rank carries
// its group's bytes. Every rank keeps the same queues, and only agreed vector slots move
// them: a rank reports how far a job's leading pages are done as far as its own pages go
// (the position of its first own page not done, see vouched), and the MIN over the group is
// the prefix every rank vouches for.

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

// StorageJob is this rank's share of storage work: the pages of a backup, query or read that
// this rank owns, in sequence order. Its driver runs it in the background and reports the
// result as a StorageDone counting these pages only; a rank that owns none of a job's pages
// gets no job (the core counts its share done at once).
type StorageJob struct {
	Kind   StorageKind
	Seq    uint64
	Node   uint64       // put: node id (messages)
	Hashes []PageID     // ids of this rank's pages (storage keys derive from them)
	Binds  []Binding    // put, read: what each page's value binds (its tokens and parent)
	Pages  []alloc.Page // put: L2 sources; read: reserved L2 destinations (all in this rank's slab)
}

// putOp is a backup to storage in flight: the node's L2 pages are pinned (not evictable)
// until the group agreed every rank stored its part.
type putOp struct {
	seq   uint64
	node  *treeNode
	pages int   // the node's pages when the backup started (a split may shorten the node)
	depth int   // the node's depth then: the heads split off it since lie at this depth or below
	ev    Event // with events on: the run backed up, as an EventStored of the storage tier
	// local: this rank's part is written (err: it failed)
	done bool
	err  error
}

// queryOp asks every rank how much of a continuation it holds of its own pages.
type queryOp struct {
	seq     uint64
	key     string  // isolation key
	tokens  []int32 // the sequence up to the continuation's end
	start   int     // first continuation page (sequence page index)
	prev    PageID  // the id the continuation chains from (its key's root when start is 0)
	hashes  []PageID
	revoked bool
	// local: this rank's answer (hits: its leading own pages stored)
	answered bool
	hits     int
}

// readOp is a prefetch in flight: pages reserved in L2 (range rid, not a node), every rank
// reading its own stored pages into them.
type readOp struct {
	seq     uint64
	id      uint64 // the prefetch id (its query's id)
	rid     alloc.RangeID
	key     string // isolation key
	tokens  []int32
	start   int
	prev    PageID // as queryOp's
	hashes  []PageID
	pages   []alloc.Page
	revoked bool
	stored  int             // leading pages the group agreed are stored (≥ len(pages))
	clamp   PrefetchRefusal // RefusedQuota when the quota left fewer than stored
	// local: this rank's read of its own pages (progress: its leading own pages verified)
	done     bool
	progress int
	err      error
	wantCut  bool
}

// releaseOp is the unused part of a cut read: freed once every rank's read stopped.
type releaseOp struct {
	seq     uint64
	rid     alloc.RangeID
	pages   int
	readSeq uint64
	acked   bool // local: this rank's read I/O has stopped
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
	jobs       []StorageJob // this rank's shares of storage work, to start
	stops      []uint64     // read seqs whose I/O on this rank must stop
	// outcomes of finished prefetches by id, the oldest first in outcomeIDs (at most
	// maxOutcomes; see Core.PrefetchOutcome)
	outcomes   map[uint64]PrefetchOutcome
	outcomeIDs []uint64
	// circuitOpen: the group agreed that some rank's storage circuit breaker is open: no
	// prefetch or backup to storage is queued until it agrees the circuit closed again.
	circuitOpen bool
	localOpen   bool // local: this rank's breaker is open (StorageCircuit)
	// readRate: the read bandwidth of the slowest rank (bytes/s) the group agreed, 0
	// before any measurement; costSkips: prefetches the cost rule skipped (PrefetchCost).
	readRate, costSkips int64
	localRate           int64 // local: this rank's measured read bandwidth (StorageReadRate)
}

func (l *l3State) pending() int {
	return len(l.puts) + len(l.queries) + len(l.reads) + len(l.releases)
}

// StorageCircuit records whether this rank's storage circuit breaker is open (the driver
// calls it once per step, before Vector). It contributes to the next vector:
// the group opens the circuit at the step it agrees any rank's breaker is open, and closes
// it at the step every rank's is closed again. Local.
func (c *Core) StorageCircuit(open bool) { c.l3.localOpen = open }

// StorageReadRate records the read bandwidth this rank measured (bytes/s of its completed
// storage reads, e.g. an EWMA; 0: none yet). The driver calls it once per step, before Vector. A measurement counts only through the vector: the group agrees the
// slowest rank's, which the cost rule (L3Config.Cost.MeasuredReads)
// reads. Local.
func (c *Core) StorageReadRate(bytesPerSec int64) { c.l3.localRate = bytesPerSec }

// StorageReadRateAgreed is the read bandwidth (bytes/s) of the slowest rank the group
// agreed at the last step (0: none measured). Replicated.
func (c *Core) StorageReadRateAgreed() int64 { return c.l3.readRate }

// StorageCircuitOpen reports whether the group agreed the storage circuit open: no prefetch
// or backup to storage is queued; work already queued ends as misses or failed backups.
// Replicated.
func (c *Core) StorageCircuitOpen() bool { return c.l3.circuitOpen }

// l3Backup queues the backup of a freshly committed L2 node to storage and pins its pages
// (not while the storage circuit is open: the node stays in L2 without a storage copy).
func (c *Core) l3Backup(n *treeNode) {
	if c.l3.circuitOpen {
		return
	}
	op := &putOp{seq: c.l3.putSeq, node: n, pages: len(n.hashes), depth: n.depth}
	if c.ev.on {
		op.ev = storedEvent(n, TierStorage)
	}
	c.l3.putSeq++
	c.l3.puts = append(c.l3.puts, op)
	n.l3Own++
	c.mark(n)
	c.pinL3(n, 1)
	var hashes []PageID
	var binds []Binding
	var pages []alloc.Page
	P := c.cfg.PageSize
	for i, p := range n.l2 {
		if p.Slab == c.cfg.CPRank {
			prev := c.hs.root(n.key)
			if i > 0 {
				prev = n.hashes[i-1]
			} else if !n.parent.isRoot() {
				prev = n.parent.hashes[len(n.parent.hashes)-1]
			}
			hashes, pages = append(hashes, n.hashes[i]), append(pages, p)
			binds = append(binds, c.hs.binding(prev, n.tokens[i*P:(i+1)*P]))
		}
	}
	if len(pages) == 0 {
		op.done = true // none of the node's pages is this rank's
		return
	}
	c.l3.jobs = append(c.l3.jobs, StorageJob{Kind: StoragePut, Seq: op.seq, Node: n.id, Hashes: hashes, Binds: binds, Pages: pages})
}

// firstOwned is the first position j of a job whose pages start at sequence page start that
// this rank owns: sequence page start+j is CP rank (start+j) mod C's, so this rank's are j,
// j+C, j+2C, ...
func (c *Core) firstOwned(start int) int {
	C := c.cfg.Slabs
	return ((c.cfg.CPRank-start)%C + C) % C
}

// ownShare is this rank's share of a job over sequence pages start, start+1, ...: its hashes
// and, with pages, its pages.
func (c *Core) ownShare(start int, hashes []PageID, pages []alloc.Page) ([]PageID, []alloc.Page) {
	var hs []PageID
	var ps []alloc.Page
	for j := c.firstOwned(start); j < len(hashes); j += c.cfg.Slabs {
		hs = append(hs, hashes[j])
		if pages != nil {
			ps = append(ps, pages[j])
		}
	}
	return hs, ps
}

// vouched is how many leading pages of a k-page job from sequence page start this rank
// vouches for once the first m of its own pages are done: every page before its next own
// one (the pages between are other ranks' to vouch for), or all k when it has none left.
// The MIN over the group is the prefix every rank has done.
func (c *Core) vouched(start, k, m int) int {
	return min(k, c.firstOwned(start)+m*c.cfg.Slabs)
}

// pinL3 adds d to the storage pins of n and its ancestors: a pinned node is not evicted
// from L2 and not dropped with an ancestor.
func (c *Core) pinL3(n *treeNode, d int) {
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

// l3Vector fills this rank's L3 slots: every rank reports its own pages' part (query
// answers and read progress as the prefix it vouches for). Without L3 every slot holds its
// neutral value.
func (c *Core) l3Vector(v []int64) {
	v[vL3PutDone], v[vL3PutFail] = int64(c.l3.putSeq), math.MaxInt64
	v[vL3ReleaseAck] = int64(c.l3.releaseSeq)
	v[vL3Circuit] = 0
	if c.cfg.L3 && c.l3.localOpen {
		v[vL3Circuit] = -1
	}
	v[vL3ReadRate] = math.MaxInt64
	if c.l3.localRate > 0 { // a rank that has read from storage
		v[vL3ReadRate] = c.l3.localRate
	}
	for i := range l3Slots {
		v[vL3QueryAns+i] = math.MaxInt64
		v[vL3ReadDone+i], v[vL3ReadPages+i], v[vL3ReadCut+i] = 1, math.MaxInt64, 0
	}
	if !c.cfg.L3 {
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
			v[vL3QueryAns+i] = int64(c.vouched(q.start, len(q.hashes), q.hits))
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
		v[vL3ReadPages+i] = int64(c.vouched(r.start, len(r.pages), r.progress))
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
	if r := v[vL3ReadRate]; r != math.MaxInt64 {
		c.l3.readRate = r
	}
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
		// The node and the heads split off it while the backup ran are stored.
		for x := op.node; !x.isRoot() && x.depth >= op.depth; x = x.parent {
			x.stored = true
			c.mark(x)
		}
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
		panic(fmt.Sprintf("core: abort of prefetch range %d: %v (replica invariant broken)", id, err))
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
		circuitOpen: c.l3.circuitOpen, localOpen: c.l3.localOpen, readRate: c.l3.readRate, costSkips: c.l3.costSkips, localRate: c.l3.localRate}
}

// l3Digest folds the L3 queue positions into the tree digest.
func (c *Core) l3Digest(x uint64) uint64 {
	l := &c.l3
	x = mix.Mix64(x ^ l.putSeq ^ l.querySeq<<16 ^ l.readSeq<<32 ^ l.releaseSeq<<48)
	if l.circuitOpen {
		x = mix.Mix64(x ^ 0xc1c)
	}
	x = mix.Mix64(x ^ uint64(l.readRate) ^ uint64(l.costSkips)<<40)
	return mix.Mix64(x ^ uint64(len(l.puts)) ^ uint64(len(l.queries))<<16 ^ uint64(len(l.reads))<<32 ^ uint64(len(l.releases))<<48 ^ uint64(l.reserved)<<8)
}
