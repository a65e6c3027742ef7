package main

import (
	"fmt"

	"github.com/cpcache/cpcache/hicache"
)

// nodeTable maps node handles to nodes. A handle is (flush generation << 40) | node id: node
// ids are replicated, so a handle is equal on every rank of the replica group, and ids
// restart after a flush, so the generation keeps a handle from before a flush from naming a
// node made after it; a session's generations start above the closed sessions' (lib.nodeGen),
// as ids restart at open too. 0 is never a handle (generations start at 1).
//
// Nodes that left every tier are forgotten at a step once the table has doubled since the
// last sweep, so that the table stays proportional to the live tree. Sweeps look only at
// replicated state, so every rank forgets the same handles.
//
// A nodeTable is used under the session's lock (see lib.call).
type nodeTable struct {
	gen     uint64
	byID    map[uint64]*hicache.Node
	sweepAt int
}

const (
	nodeIDBits   = 40
	minSweepSize = 1024
)

func (t *nodeTable) init() {
	t.gen++
	t.byID = map[uint64]*hicache.Node{}
	t.sweepAt = minSweepSize
}

// handle registers n and returns its handle.
func (t *nodeTable) handle(n *hicache.Node) uint64 {
	id := n.ID()
	if t.byID[id] != n {
		t.byID[id] = n
	}
	return t.gen<<nodeIDBits | id
}

// node resolves handle h.
func (t *nodeTable) node(h uint64) (*hicache.Node, error) {
	if h>>nodeIDBits != t.gen {
		if h == 0 {
			return nil, fmt.Errorf("%w: node handle 0", errNode)
		}
		return nil, fmt.Errorf("%w: node handle %#x is from before a flush, or from a closed cache", errNode, h)
	}
	n := t.byID[h&(1<<nodeIDBits-1)]
	if n == nil {
		return nil, fmt.Errorf("%w: node handle %#x (never returned, or its node left the cache)", errNode, h)
	}
	return n, nil
}

// sweep forgets nodes that left every tier, when the table has grown enough.
func (t *nodeTable) sweep() {
	if len(t.byID) < t.sweepAt {
		return
	}
	for id, n := range t.byID {
		if id != 0 && n.State() == 0 {
			delete(t.byID, id)
		}
	}
	t.sweepAt = max(minSweepSize, 2*len(t.byID))
}
