package core

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/slab/alloc"
)

// Handle names a node of the tree: (generation << 40) | node id. Node ids are replicated
// and the generation changes at every reset of the tree (Reset, the recovery that ends a
// quarantine), so a handle is equal on every rank of the group and one from before a reset
// never names a node made after it. 0 is never a handle (generations start at 1). The
// root's handle (id 0) stands for the empty prefix: Lock, Unlock and LoadBack of it do
// nothing, and the root's handle of any of this core's generations is accepted as the
// current root's, so that a lock a request holds on the empty prefix outlives a reset.
// Every call taking a Handle checks it; one that names no node of the tree (never handed
// out, evicted, from before a reset, from another core) returns a *StaleHandleError.
type Handle uint64

// HandleIDBits is the width of the node id in a Handle.
const HandleIDBits = 40

// Generation is the handle generation of the tree's nodes: Options.Generation plus the
// resets so far. Replicated.
func (c *Core) Generation() uint64 { return c.gen }

func (n *treeNode) handle() Handle { return Handle(n.gen<<HandleIDBits | n.id) }

// StaleHandleError is the error of a call given a handle that names no node of the tree. It
// wraps ErrStaleHandle and ErrBadArgument.
type StaleHandleError struct {
	Handle Handle
	Why    string // what is wrong with it: 0, from another generation, not in the tree
}

func (e *StaleHandleError) Error() string {
	return fmt.Sprintf("core: node handle %#x: %s", uint64(e.Handle), e.Why)
}

func (e *StaleHandleError) Unwrap() []error { return []error{ErrStaleHandle, ErrBadArgument} }

// node resolves h to a node of the current tree (the root for the root's handle).
func (c *Core) node(h Handle) (*treeNode, error) {
	gen, id := uint64(h)>>HandleIDBits, uint64(h)&(1<<HandleIDBits-1)
	switch {
	case h == 0:
		return nil, &StaleHandleError{Handle: h, Why: "handle 0"}
	case id == 0 && gen > c.cfg.Generation && gen <= c.gen:
		return c.root, nil
	case gen != c.gen:
		return nil, &StaleHandleError{Handle: h, Why: "from before a flush or a recovery, or from another cache"}
	}
	n := c.byID[id]
	if n == nil {
		return nil, &StaleHandleError{Handle: h, Why: "not in the tree (evicted, or never handed out)"}
	}
	return n, nil
}

// NodeInfo is a copy of a node's replicated state: the caller owns its slices.
type NodeInfo struct {
	Handle Handle
	Parent Handle // the node above; the root's handle when the node hangs from the root
	ID     uint64 // the node's replicated id (also its L2 range id in the slab allocator)
	Depth  int    // pages above the node: its first page is sequence page Depth
	Key    string // isolation key its pages were cached under ("" by default)
	State  NodeState
	Hashes []PageID     // ids of its pages (L3 keys derive from them)
	L1     []int32      // L1 slot of each page; nil when not in L1
	L2     []alloc.Page // committed L2 page of each page (page j in slab (Depth+j) mod C); nil when not in L2
}

// Pages is the number of pages the node holds.
func (i NodeInfo) Pages() int { return len(i.Hashes) }

func (n *treeNode) info() NodeInfo {
	inf := NodeInfo{Handle: n.handle(), ID: n.id, Depth: n.depth, Key: n.key, State: n.state(),
		Hashes: slices.Clone(n.hashes), L1: slices.Clone(n.l1), L2: slices.Clone(n.l2)}
	if n.parent != nil {
		inf.Parent = n.parent.handle()
	}
	return inf
}

// Node returns a copy of the state of the node h names (see NodeInfo). Read-only: a rank
// may call it alone.
func (c *Core) Node(h Handle) (NodeInfo, error) {
	n, err := c.node(h)
	if err != nil {
		return NodeInfo{}, err
	}
	return n.info(), nil
}
