package core

import (
	"slices"

	"github.com/cpcache/cpcache/internal/mix"
	"github.com/cpcache/cpcache/slab/alloc"
)

// treeNode is one radix-tree node: a run of whole pages of one token prefix. The scheduler
// names it by its Handle (Match and Insert return it; Lock, Unlock, LoadBack and Loading take
// it); the node itself never leaves the core. Every field is replicated state: equal on every
// rank of the group.
type treeNode struct {
	id        uint64
	gen       uint64 // Core.gen when created: the generation of its Handle
	removed   bool
	parent    *treeNode
	children  []*treeNode // in creation order (replicated)
	depth     int         // pages above this node in its sequence
	key       string      // isolation key (the empty key by default); seeds the page ids
	tokens    []int32     // pages × PageSize tokens
	hashes    []PageID    // id of each page (hash.go)
	indexNext *treeNode   // next node in its Core.index chain (not replicated: lookups only)

	l1     []int32      // L1 slot of each page; nil when not in L1
	l2     []alloc.Page // committed L2 page of each page; nil when not in L2
	l1Kids int          // children holding L1 pages
	stale  bool         // L1 slots allocated but a load-back failed on some rank: not servable

	write           *writeOp // backup in flight (L2 range reserved, not committed)
	load            *loadOp  // load-back in flight (L1 slots allocated, data arriving)
	evictAfterWrite bool     // write-back eviction: free L1 once the backup commits

	// stored: storage holds every page of the node (an acknowledged backup of it, or a
	// prefetch inserted it); an L2 copy of a stored L1 node may be dropped for room
	// (dropL2Copies).
	stored   bool
	l3Pins   int // storage backups in flight on this node or a descendant
	l3Own    int // storage backups in flight on this node itself
	lockRef  int // Lock calls on this node or a descendant, not yet unlocked
	ownLocks int // Lock calls on this node itself
	hits     int

	list       int8 // inNoList, inL1List, inL2List
	prev, next *treeNode
	lruSeq     uint64 // Core.lruClock when last moved to the back of its list

	term  uint64 // this node's current share of Core.stateSum (see stateTerm)
	dirty bool   // in Core.dirty: term is recomputed at the next vector

	// KV events (local bookkeeping, not replicated state: see events.go)
	evDirty      bool // in Core.ev.nodes
	pubL1, pubL2 bool // the last events reported the node's pages held in L1 / L2
}

// NodeState is a set of node state flags.
type NodeState uint8

// Node state flags.
const (
	StateL1      NodeState = 1 << iota // holds L1 pages (maybe loading or stale)
	StateL2                            // has a committed L2 copy
	StateWriting                       // a backup is in flight
	StateLoading                       // a load-back is in flight
	StateStale                         // L1 pages are not servable (a load failed on some rank)
)

func (s NodeState) String() string {
	out := ""
	for i, name := range []string{"l1", "l2", "writing", "loading", "stale"} {
		if s&(1<<i) != 0 {
			if out != "" {
				out += "+"
			}
			out += name
		}
	}
	if out == "" {
		return "none"
	}
	return out
}

// state returns the node's tiers and transfers in flight.
func (n *treeNode) state() NodeState {
	var s NodeState
	if n.l1 != nil {
		s |= StateL1
	}
	if n.l2 != nil {
		s |= StateL2
	}
	if n.write != nil {
		s |= StateWriting
	}
	if n.load != nil {
		s |= StateLoading
	}
	if n.stale {
		s |= StateStale
	}
	return s
}

func (n *treeNode) busy() bool { return n.write != nil || n.load != nil || n.evictAfterWrite }

func (n *treeNode) isRoot() bool { return n.parent == nil }

func (n *treeNode) unlinkChild(c *treeNode) {
	i := slices.Index(n.children, c)
	n.children = slices.Delete(n.children, i, i+1)
}

// stateTerm is n's share of the tree digest beyond its identity (nodeTerm): its tiers,
// transfers, flags, locks, storage pins, hits and LRU position — everything a replicated
// decision (match, eviction, backup, load-back) reads.
func stateTerm(n *treeNode) uint64 {
	var f uint64
	for i, b := range [...]bool{n.l1 != nil, n.l2 != nil, n.stale, n.write != nil, n.load != nil, n.evictAfterWrite, n.stored} {
		if b {
			f |= 1 << i
		}
	}
	x := mix.Mix64(n.id ^ f<<56 ^ uint64(n.list)<<52 ^ uint64(n.l1Kids)<<32)
	x = mix.Mix64(x ^ uint64(n.lockRef) ^ uint64(n.ownLocks)<<16 ^ uint64(n.l3Pins)<<32 ^ uint64(n.l3Own)<<48)
	return mix.Mix64(x ^ uint64(n.hits) ^ n.lruSeq<<20)
}

// nodeTerm is a node's contribution to the O(1)-maintained tree digest.
func nodeTerm(n *treeNode) uint64 {
	return mix.Mix64(n.id*0x9e3779b97f4a7c15 ^ mix.Mix64(n.hashes[len(n.hashes)-1].Index()) ^ uint64(n.depth)<<32 ^ uint64(len(n.hashes)))
}
