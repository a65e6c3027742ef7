package core

// lruList is an intrusive doubly linked list of nodes, least recently used first. The core
// keeps two: nodes holding L1 pages, and nodes held only in L2. Touches move a node to the
// back, deepest node first and then its ancestors, so every node stands behind all of its
// descendants in its list: a forward scan meets leaves before their parents, and one pass
// can evict a whole idle subtree bottom-up. The order is a function of the replicated call
// sequence only, so every replica evicts the same nodes.
type lruList struct {
	head treeNode // sentinel: head.next is the least recently used
	n    int
}

const (
	inNoList = iota
	inL1List
	inL2List
)

func (l *lruList) init() {
	l.head.next, l.head.prev = &l.head, &l.head
	l.n = 0
}

func (l *lruList) pushBack(n *treeNode) {
	n.prev = l.head.prev
	n.next = &l.head
	l.head.prev.next = n
	l.head.prev = n
	l.n++
}

func (l *lruList) remove(n *treeNode) {
	n.prev.next = n.next
	n.next.prev = n.prev
	n.prev, n.next = nil, nil
	l.n--
}

func (l *lruList) front() *treeNode {
	if l.head.next == &l.head {
		return nil
	}
	return l.head.next
}

// after returns the node after n, or nil at the end.
func (l *lruList) after(n *treeNode) *treeNode {
	if n.next == &l.head {
		return nil
	}
	return n.next
}
